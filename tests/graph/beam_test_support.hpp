// Shared fixtures for Beam tests: a deterministic packed batch and fp32 model weights.
#pragma once
#include <memory>

#include "graph/data/data_source.hpp"
#include "graph/models/beam/model.hpp"
#include "kernels/rng.hpp"

namespace atl::testing {

inline Batch synthetic_batch(std::int64_t rows, std::int64_t seq, std::uint64_t seed, std::int64_t vocab = 250) {
  DataConfig dc;
  dc.synthetic_min_doc = 5;
  dc.synthetic_max_doc = 20;  // several documents per row: masks and positions matter
  return make_data_source(dc, vocab, seed)->next(rows, seq);
}

// Weights for Beam's gradient checks: the init, with every ones/zeros parameter (norm gammas,
// gate biases) moved by 0.1 * normal so its gradient is generic; the correction biases stay zero
// (selection only, MODELS.md §10.1.7).
inline TensorMap beam_gradient_check_weights(const BeamModel& model, std::uint64_t seed) {
  TensorMap w = TensorMap::initialized(model.specs(), seed, 0.02f);
  for (const auto& s : model.specs()) {
    if (s.init != Init::normal && !s.name.ends_with("e_score_correction_bias")) {
      CounterRng rng(5, s.name);
      float* p = w.at(s.name).data<float>();
      for (std::int64_t i = 0; i < s.numel(); ++i) p[i] += static_cast<float>(0.1 * rng.normal(i));
    }
  }
  return w;
}

}  // namespace atl::testing
