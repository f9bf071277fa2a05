// Precision islands compute in fp32 inside a bf16 run, bulk parameters in bf16 (MODELS.md §5.2,
// §10.2.9, §10.3.4, §10.4): for every parameter of each family's tiny preset, the bf16 logits with
// the parameter at its bf16 value times (1 ± 2^-10), a change below bf16 resolution, are compared
// with the logits at its bf16 value. A bulk parameter (gathered in bf16) gives the same bits; an
// island changes them, unless some kernel rounds it to bf16 on the way (a router GEMM on bf16
// operands, a clip scale multiplied as bf16). The router's correction bias only selects experts,
// which a change this small does not flip: it is checked to keep fp32 in the compute weights.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "graph/models/beam/model.hpp"
#include "graph/models/flint/model.hpp"
#include "graph/models/inkling2/model.hpp"
#include "graph/param.hpp"
#include "kernels/dtype.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/support/same_bits.hpp"

using namespace atl;
using testing::same_bits;

namespace {

Tensor bf16_logits(const Model& model, const TensorMap& master, const Batch& batch) {
  Tensor logits;
  model.forward(compute_weights(model.specs(), master, Precision::bf16), batch, Precision::bf16, &logits);
  return logits;
}

bool selects_only(const std::string& name) { return name.ends_with("e_score_correction_bias"); }

void check_islands_compute_in_fp32(const Model& model) {
  TensorMap master = TensorMap::initialized(model.specs(), 8, 0.02f);
  // Tensors that start at zero (depth queries, sinks) or one (norms, clip scales) get other
  // values: a zero does not move when nudged, and x times a one-valued scale, nudged, rounds back
  // to x. Islands drawn from N(0, 0.02) (routers, Flint's head) are 16x that: router logits near
  // 0 give every chosen expert nearly the same weight, which a nudge barely moves. Every tensor
  // starts on the bf16 grid, so "its bf16 value" is the tensor itself.
  for (const ParamSpec& s : model.specs()) {
    float* p = master.at(s.name).data<float>();
    for (std::int64_t i = 0; i < s.numel(); ++i) {
      if (s.island && s.init == Init::normal) p[i] *= 16.0f;
      if (s.init == Init::zeros) p[i] = 0.05f * static_cast<float>(1 + i % 7);
      if (s.init == Init::ones) p[i] = 1.0f + 0.03f * static_cast<float>(1 + i % 5);
      p[i] = round_to_bf16(p[i]);
    }
  }
  const Batch batch = testing::synthetic_batch(2, 32, 9);
  const Tensor plain = bf16_logits(model, master, batch);
  int islands = 0;
  for (const ParamSpec& s : model.specs()) {
    INFO(model.family() << ": " << s.name << (s.island ? " (island)" : " (bulk)"));
    TensorMap nudged = master.clone();
    float* p = nudged.at(s.name).data<float>();
    // Below half a bf16 ulp (2^-9 of the value at least, either side): rounds back to the bf16
    // value. Alternate signs, so the nudge is not a scale that a normalisation takes out.
    for (std::int64_t i = 0; i < s.numel(); ++i) p[i] *= i % 2 ? 1.0f - 1.0f / 1024.0f : 1.0f + 1.0f / 1024.0f;
    if (selects_only(s.name)) {
      CHECK(s.island);
      CHECK(same_bits(compute_weights(model.specs(), nudged, Precision::bf16).at(s.name), nudged.at(s.name)));
      continue;
    }
    const bool moved = !same_bits(bf16_logits(model, nudged, batch), plain);
    CHECK(moved == s.island);
    islands += s.island;
  }
  CHECK(islands > 0);
}

}  // namespace

TEST_CASE("bf16 islands: Inkling2's depth queries, clip scales and routers compute in fp32, the rest in bf16",
          "[bf16][inkling2]") {
  check_islands_compute_in_fp32(Inkling2Model(inkling2_preset("inkling2-tiny")));
}

TEST_CASE("bf16 islands: Flint's sinks and lm_head compute in fp32, the rest (its router too) in bf16",
          "[bf16][flint]") {
  check_islands_compute_in_fp32(FlintModel(flint_preset("flint-tiny")));
}

TEST_CASE("bf16 islands: Beam's routers compute in fp32, the rest in bf16", "[bf16][beam]") {
  check_islands_compute_in_fp32(BeamModel(beam_preset("beam-tiny-moe")));
}
