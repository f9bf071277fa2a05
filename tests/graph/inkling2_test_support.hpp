// Shared fixtures for Inkling2 tests: the weights of its gradient checks.
#pragma once
#include <cstdint>

#include "graph/models/inkling2/model.hpp"
#include "graph/param.hpp"
#include "kernels/ops/elementwise.hpp"
#include "kernels/rng.hpp"

namespace atl::testing {

// Weights with every ones/zeros-initialised parameter (gammas, clip scales, depth queries)
// perturbed, so their gradients are generic and the AttnRes mixes are not uniform. The
// correction biases stay zero (selection only, MODELS.md §10.1.7).
inline TensorMap inkling2_generic_weights(const Inkling2Model& model, std::uint64_t seed) {
  TensorMap w = TensorMap::initialized(model.specs(), seed, 0.02f);
  for (const auto& s : model.specs()) {
    if (s.init != Init::normal && !s.name.ends_with("e_score_correction_bias")) {
      CounterRng rng(5, s.name);
      float* p = w.at(s.name).data<float>();
      const double scale = s.name.ends_with("query.weight") ? 0.5 : 0.1;
      for (std::int64_t i = 0; i < s.numel(); ++i) p[i] += static_cast<float>(scale * rng.normal(i));
    }
    // Relative logits of a useful size (at init_std they are ~1e-3 and their gradients sit at
    // the fp32 noise floor of a finite difference).
    if (s.name.ends_with("relative_table")) scale_inplace(w.at(s.name), 10.0f);
    // Well separated router scores: fewer top-k near-ties for a finite difference to cross.
    if (s.name.ends_with("mlp.gate.weight")) scale_inplace(w.at(s.name), 10.0f);
  }
  return w;
}

}  // namespace atl::testing
