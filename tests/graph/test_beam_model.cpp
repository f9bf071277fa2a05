#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "graph/models/beam/model.hpp"
#include "kernels/ops/optim.hpp"
#include "kernels/rng.hpp"
#include "tests/graph/gradient_check.hpp"
#include "tests/graph/model_test_support.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/support/worst_of.hpp"

using namespace atl;

namespace {


// The whole-model gradient check (tests/graph/gradient_check.hpp, its default directions). Stated
// tolerance: testing::kGradientTolerance.
double worst_directional_error(const BeamConfig& config, std::string* worst_name) {
  BeamModel model(config);
  TensorMap w = testing::beam_gradient_check_weights(model, 11);
  testing::GradientCheckOptions options;
  options.zero_gradient = [](const std::string& name) { return name.ends_with("e_score_correction_bias"); };
  const testing::GradientCheck check =
      testing::check_whole_model_gradient(model, w, testing::synthetic_batch(2, 32, 3), options);
  if (worst_name) *worst_name = check.worst_name;
  return check.worst;
}

}  // namespace

TEST_CASE("Beam presets declare the parameters MODELS.md lists", "[beam]") {
  BeamModel moe(beam_preset("beam-tiny-moe"));
  int islands = 0;
  for (const auto& s : moe.specs()) {
    if (s.island) {
      ++islands;
      CHECK((s.name.ends_with("mlp.gate.weight") || s.name.ends_with("mlp.gate.e_score_correction_bias")));
      CHECK(s.compute_dtype(Precision::bf16) == DType::f32);
    } else {
      CHECK(s.compute_dtype(Precision::bf16) == DType::bf16);
    }
    CHECK(s.compute_dtype(Precision::fp32) == DType::f32);
  }
  CHECK(islands == 2 * 4);  // router weight + correction bias in each of the 4 sparse layers
  BeamModel dense(beam_preset("beam-tiny-dense"));
  for (const auto& s : dense.specs()) CHECK_FALSE(s.island);
  BeamModel small(beam_preset("beam-small"));
  CHECK(small.parameter_count() > 7'000'000);
  CHECK(small.parameter_count() < 8'000'000);  // "≈7.5M params" (MODELS.md §4)
  CHECK_THROWS_WITH(beam_preset("beam-huge"), Catch::Contains("beam-tiny-moe"));
}

TEST_CASE("Whole-model gradient check: beam-tiny-moe", "[beam][grad]") {
  std::string worst;
  double err = worst_directional_error(beam_preset("beam-tiny-moe"), &worst);
  INFO("worst tensor: " << worst);
  CHECK(err < testing::kGradientTolerance);
}

TEST_CASE("Whole-model gradient check: beam-tiny-moe with a shared expert", "[beam][grad]") {
  BeamConfig config = beam_preset("beam-tiny-moe");
  config.n_shared_experts = 1;
  std::string worst;
  double err = worst_directional_error(config, &worst);
  INFO("worst tensor: " << worst);
  CHECK(err < testing::kGradientTolerance);
}

TEST_CASE("Whole-model gradient check: beam-tiny-dense", "[beam][grad]") {
  std::string worst;
  double err = worst_directional_error(beam_preset("beam-tiny-dense"), &worst);
  INFO("worst tensor: " << worst);
  CHECK(err < testing::kGradientTolerance);
}

TEST_CASE("Beam logits obey the softcap and the unused-vocabulary mask", "[beam]") {
  BeamModel model(beam_preset("beam-tiny-moe"));
  TensorMap w = TensorMap::initialized(model.specs(), 1, 3.0f);  // large init: logits reach the cap
  Batch batch = testing::synthetic_batch(2, 32, 4);
  Tensor logits;
  model.forward(w, batch, Precision::fp32, &logits);
  REQUIRE(logits.shape() == Shape{2, 32, 256});
  const float* z = logits.data<float>();
  float max_abs = 0;
  for (std::int64_t t = 0; t < 64; ++t) {
    for (std::int64_t v = 0; v < 256; ++v) {
      float x = z[t * 256 + v];
      if (v >= 250) {
        CHECK(x == -std::numeric_limits<float>::infinity());
      } else {
        max_abs = atl::testing::worst_of(max_abs, std::abs(x));
      }
    }
  }
  CHECK(max_abs <= 30.0f);
  CHECK(max_abs > 20.0f);  // the cap was actually exercised
}

TEST_CASE("Beam keeps documents isolated inside a packed row", "[beam]") {
  BeamModel model(beam_preset("beam-tiny-moe"));
  TensorMap w = TensorMap::initialized(model.specs(), 2, 0.1f);
  Batch a = testing::synthetic_batch(1, 32, 5);
  testing::check_document_isolation(model, w, a);
}

TEST_CASE("Beam in bf16 tracks fp32: the loss within 5% of what the model adds to a uniform guess, the same "
          "experts, every gradient aligned", "[beam][bf16]") {
  // Measured: loss 1.5% of the excess, experts 97.5% the same, worst cosine 0.90 (an output gate bias).
  testing::check_bf16_tracks_fp32(BeamModel(beam_preset("beam-tiny-moe")), 0.85);
}
