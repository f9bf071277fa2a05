// Each family's MoE, as the model builds it for its tiny preset, is the one MODELS.md describes:
// activation and gate/up layout (§0.5, §10.2.10, §10.3.3), where the routing weight applies
// (§10.2.7, §10.3.4, §10.4.6), the router's score function and normalisation, and which extras it
// has. The kernels' own tests check each setting's arithmetic; this checks each family picks the
// right ones (in fp32 a weight before or after down is the same sum, so no parity test can tell).
#include <catch2/catch.hpp>

#include "graph/models/beam/model.hpp"
#include "graph/models/flint/model.hpp"
#include "graph/models/inkling2/model.hpp"

using namespace atl;

TEST_CASE("MoE specs: Inkling2 situ interleaved, weight before down, sigmoid router with bias", "[moe][inkling2]") {
  const MoeMlpSpec m = Inkling2Model(inkling2_preset("inkling2-tiny")).moe_spec();
  CHECK(m.experts.activation == GluActivation::situ);
  CHECK(m.experts.layout == GluLayout::interleaved);
  CHECK_FALSE(m.experts.weight_after_down);
  CHECK(m.router.score == ScoreFunction::sigmoid_with_bias);
  CHECK(m.router.norm_topk_prob);
  CHECK(m.router.route_scale == 1.0f);
  CHECK(m.router.n_group == 1);
  CHECK(m.correction_bias);
  CHECK(m.shared_width == 0);  // §10.2.7: not supported
}

TEST_CASE("MoE specs: Flint SwiGLU concatenated, weight after down, softmax router, shared expert",
          "[moe][flint]") {
  const MoeMlpSpec m = FlintModel(flint_preset("flint-tiny")).moe_spec();
  CHECK(m.experts.activation == GluActivation::swiglu);
  CHECK(m.experts.layout == GluLayout::concatenated);
  CHECK(m.experts.weight_after_down);
  CHECK(m.router.score == ScoreFunction::softmax_before_topk);
  CHECK_FALSE(m.correction_bias);
  CHECK(m.shared_width == flint_preset("flint-tiny").shared_expert_intermediate_size);  // ungated, weight 1
  CHECK(m.shared_width > 0);  // flint-tiny has one
}

TEST_CASE("MoE specs: Beam SwiGLU concatenated, weight before down, grouped sigmoid router normalised for top-1",
          "[moe][beam]") {
  const MoeMlpSpec m = BeamModel(beam_preset("beam-tiny-moe")).moe_spec();
  CHECK(m.experts.activation == GluActivation::swiglu);
  CHECK(m.experts.layout == GluLayout::concatenated);
  CHECK_FALSE(m.experts.weight_after_down);
  CHECK(m.router.score == ScoreFunction::sigmoid_with_bias);
  CHECK(m.router.norm_topk_prob);
  CHECK(m.router.norm_topk_prob_top1);
  CHECK(m.router.route_scale == 1.0f);
  CHECK(m.router.n_group == 2);  // beam-tiny-moe: n_group 2, topk_group 1 (§4)
  CHECK(m.router.topk_group == 1);
  CHECK(m.correction_bias);
  CHECK(m.shared_width == 0);  // n_shared_experts defaults to 0
}
