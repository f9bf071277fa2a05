// The whole-model gradient check (tests/graph/gradient_check.hpp) must be able to fail: each
// case corrupts the analytic gradient of one beam-tiny-moe tensor the way a backward bug would
// (a missing part, a wrong scale) and requires the check of that tensor to report an error
// above the stated tolerance; the uncorrupted gradient of the same tensor passes. The weights are
// the beam check's. Not every tensor can show a 2% error: the check lists those that cannot
// (GradientCheck::blind_to_2_percent; only small ones, e.g. beam-tiny-moe's last two routers).
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <string>

#include "graph/models/beam/model.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/graph/gradient_check.hpp"

using namespace atl;

namespace {

struct Corruption {
  const char* what;
  const char* tensor;
  std::function<void(Tensor&)> apply;
};

// Zeroes rows [first, last) of a tensor whose first dimension is rows.
std::function<void(Tensor&)> zero_rows(double first, double last) {
  return [=](Tensor& g) {
    const std::int64_t rows = g.shape().at(0), row_size = g.numel() / rows;
    float* p = g.data<float>();
    const auto begin = static_cast<std::int64_t>(first * static_cast<double>(rows));
    const auto end = static_cast<std::int64_t>(last * static_cast<double>(rows));
    std::fill(p + begin * row_size, p + end * row_size, 0.0f);
  };
}

std::function<void(Tensor&)> zero_element(std::int64_t i) {
  return [=](Tensor& g) { g.data<float>()[i] = 0.0f; };
}

std::function<void(Tensor&)> scale_by(float factor) {
  return [=](Tensor& g) {
    for (float& v : g.span<float>()) v *= factor;
  };
}

testing::GradientCheck check_one(const char* tensor, const std::function<void(Tensor&)>& corrupt) {
  BeamModel model(beam_preset("beam-tiny-moe"));
  TensorMap w = testing::beam_gradient_check_weights(model, 11);  // the weights of the beam check
  testing::GradientCheckOptions options;
  options.only = [&](const std::string& name) { return name == tensor; };
  if (corrupt) options.corrupt = [&](const std::string&, Tensor& g) { corrupt(g); };
  return testing::check_whole_model_gradient(model, w, testing::synthetic_batch(2, 32, 3), options);
}

}  // namespace

TEST_CASE("The whole-model gradient check fails on a corrupted gradient", "[grad]") {
  const Corruption corruption = GENERATE(
      Corruption{"first half of q_proj zeroed", "model.layers.0.self_attn.q_proj.weight", zero_rows(0, 0.5)},
      Corruption{"last half of q_proj zeroed", "model.layers.0.self_attn.q_proj.weight", zero_rows(0.5, 1)},
      Corruption{"first 10% of q_proj zeroed", "model.layers.0.self_attn.q_proj.weight", zero_rows(0, 0.1)},
      Corruption{"q_proj rows 8 to 24 (a head) zeroed", "model.layers.0.self_attn.q_proj.weight",
                 zero_rows(0.125, 0.375)},
      Corruption{"q_proj scaled by 1.02", "model.layers.0.self_attn.q_proj.weight", scale_by(1.02f)},
      Corruption{"first half of the embedding zeroed", "model.embed_tokens.weight", zero_rows(0, 0.5)},
      Corruption{"embedding scaled by 1.02", "model.embed_tokens.weight", scale_by(1.02f)},
      Corruption{"last expert's down projection zeroed", "model.layers.2.mlp.experts.down_projs", zero_rows(0.875, 1)},
      Corruption{"a middle expert's gate and up projections zeroed", "model.layers.2.mlp.experts.gate_and_up_projs",
                 zero_rows(0.375, 0.5)},
      Corruption{"the first router scaled by 1.02", "model.layers.0.mlp.gate.weight", scale_by(1.02f)},
      Corruption{"one element of a 4-element gate bias zeroed", "model.layers.0.self_attn.output_gate_bias",
                 zero_element(1)},
      Corruption{"the final norm scaled by 0.98", "model.norm.weight", scale_by(0.98f)});
  INFO(corruption.what);
  const testing::GradientCheck clean = check_one(corruption.tensor, {});
  INFO("clean: " << clean.worst_name);
  CHECK(clean.directions >= 4);  // g, a random mix, 8 row blocks (or one per element)
  CHECK(clean.worst < testing::kGradientTolerance);
  const testing::GradientCheck corrupted = check_one(corruption.tensor, corruption.apply);
  INFO("corrupted: " << corrupted.worst_name);
  CHECK(corrupted.worst > testing::kGradientTolerance);
}
