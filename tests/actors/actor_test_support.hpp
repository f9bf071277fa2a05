// Shared by the actor runtime tests of every family: a run config for a mesh, running an engine
// on fixed synthetic batches, and comparisons of the results.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "graph/data/data_source.hpp"
#include "graph/models/model.hpp"
#include "graph/training/run.hpp"
#include "tests/support/worst_of.hpp"

namespace atl::testing {

struct Layout {
  int dp_shard = 1, dp_replicate = 1, ep = 1;
};

// 10 steps of `global_batch` rows of 32 tokens; `topology_extra` is appended inside topology {...}.
inline RunConfig parity_config(const std::string& family, const std::string& preset, Precision precision,
                               Layout layout, std::int64_t global_batch, std::int64_t micro_batch = 1,
                               const std::string& topology_extra = "") {
  const std::string yaml = "model: {family: " + family + ", preset: " + preset + "}\n" +
                           "precision: " + precision_name(precision) + "\n" +
                           "topology: {mesh: {dp_shard: " + std::to_string(layout.dp_shard) +
                           ", dp_replicate: " + std::to_string(layout.dp_replicate) +
                           ", ep: " + std::to_string(layout.ep) + "}" + topology_extra + "}\n" +
                           "train: {steps: 10, global_batch: " + std::to_string(global_batch) +
                           ", micro_batch: " + std::to_string(micro_batch) +
                           ", seq_len: 32, lr: 3.0e-3, warmup: 2, seed: 7}\n";
  return parse_run_config(yaml, family + "-test.yaml");
}

struct RunOutput {
  std::vector<StepResult> steps;
  TensorMap master;
};

// Runs `steps` steps with the engine the factory builds, on the same synthetic batches every time.
inline RunOutput run_engine(const RunConfig& config, const EngineFactory& factory, int steps,
                            bool record_first_routing = true, std::unique_ptr<TrainingEngine>* keep = nullptr) {
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  auto engine = factory(EngineInputs{.config = config,
                                     .model = model,
                                     .initial_master = TensorMap::initialized(model->specs(), config.train.seed,
                                                                              model->init_std()),
                                     .optimizer = optimizer_settings(config.train),
                                     .keep_collective_records = true});
  DataConfig data;
  data.synthetic_min_doc = 5;
  data.synthetic_max_doc = 40;
  auto source = make_data_source(data, model->unpadded_vocab_size(), 99);
  RunOutput out;
  for (int s = 0; s < steps; ++s) {
    out.steps.push_back(engine->step(source->next(config.train.global_batch, config.train.seq_len),
                                     record_first_routing && s == 0));
  }
  out.master = engine->master_weights();
  if (keep) *keep = std::move(engine);
  return out;
}

// The same tensor names in the same order with the same shapes (else the comparisons below fail).
inline bool same_layout(const TensorMap& a, const TensorMap& b) {
  if (a.names() != b.names()) return false;
  for (const auto& name : a.names()) {
    if (a.at(name).shape() != b.at(name).shape()) return false;
  }
  return true;
}

// max |a - b| / max(1e-2, |a|) over every element; infinity when the layouts differ.
inline double max_relative_param_diff(const TensorMap& a, const TensorMap& b) {
  if (!same_layout(a, b)) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (const auto& name : a.names()) {
    const auto pa = a.at(name).span<float>(), pb = b.at(name).span<float>();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      const double scale = std::max(1e-2, static_cast<double>(std::abs(pa[i])));
      worst = atl::testing::worst_of(worst, std::abs(static_cast<double>(pa[i]) - pb[i]) / scale);
    }
  }
  return worst;
}

inline bool bitwise_equal(const TensorMap& a, const TensorMap& b) {
  if (!same_layout(a, b)) return false;
  for (const auto& name : a.names()) {
    const auto pa = a.at(name).span<float>(), pb = b.at(name).span<float>();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      if (std::bit_cast<std::uint32_t>(pa[i]) != std::bit_cast<std::uint32_t>(pb[i])) return false;
    }
  }
  return true;
}

// Per step: loss and gradient norm within `tolerance` relative to the reference's; when `bitwise`
// the loss is bitwise equal and the gradient norm within 1e-9: the gradients are the same bits,
// but the norm is a double sum of squares that the runtime adds per unit shard and then over
// ranks, the reference per tensor (the order differs, the float clip factor does not).
inline void check_same_steps(const RunOutput& act, const RunOutput& ref, double tolerance, bool bitwise) {
  REQUIRE(act.steps.size() == ref.steps.size());
  for (std::size_t s = 0; s < ref.steps.size(); ++s) {
    INFO("step " << s + 1 << ": loss " << act.steps[s].loss << " vs " << ref.steps[s].loss << ", grad norm "
                 << act.steps[s].grad_norm << " vs " << ref.steps[s].grad_norm);
    CHECK(std::abs(act.steps[s].loss - ref.steps[s].loss) <= tolerance * std::abs(ref.steps[s].loss));
    CHECK(std::abs(act.steps[s].grad_norm - ref.steps[s].grad_norm) <= tolerance * std::abs(ref.steps[s].grad_norm));
    CHECK(ref.steps[s].grad_norm > 0);
    if (bitwise) {
      CHECK(act.steps[s].loss == ref.steps[s].loss);
      CHECK(std::abs(act.steps[s].grad_norm - ref.steps[s].grad_norm) <= 1e-9 * ref.steps[s].grad_norm);
      CHECK(act.steps[s].expert_load == ref.steps[s].expert_load);  // the same routing, counted over ranks
    }
  }
}

// The same router choices, per micro-batch and layer. Something must have been recorded: at least
// one micro-batch, each with records (one per sparse layer, as many in both runs) when the model
// `routes` and none when it is dense, so two runs that recorded nothing never agree.
inline bool same_routing(const std::vector<std::vector<RoutingRecord>>& a,
                         const std::vector<std::vector<RoutingRecord>>& b, bool routes = true) {
  if (a.empty() || a.size() != b.size()) return false;
  for (std::size_t m = 0; m < a.size(); ++m) {
    if (a[m].size() != b[m].size() || a[m].empty() == routes) return false;
    for (std::size_t l = 0; l < a[m].size(); ++l) {
      const auto x = a[m][l].indices.span<std::int32_t>(), y = b[m][l].indices.span<std::int32_t>();
      if (a[m][l].layer != b[m][l].layer || !std::equal(x.begin(), x.end(), y.begin(), y.end())) return false;
    }
  }
  return true;
}

// Two engines of one job (two "processes") take part in every collective: each call runs on both
// at once, the second on a thread of its own.
inline std::pair<StepResult, StepResult> step_both(TrainingEngine& first, const Batch& mine, TrainingEngine& second,
                                                   const Batch& theirs, bool record_routing = false) {
  StepResult a, b;
  std::thread other([&] { b = second.step(theirs, record_routing); });
  a = first.step(mine, record_routing);
  other.join();
  return {std::move(a), std::move(b)};
}
inline std::pair<TrainingState, TrainingState> state_of_both(TrainingEngine& first, TrainingEngine& second) {
  TrainingState a, b;
  std::thread other([&] { b = second.state(); });
  a = first.state();
  other.join();
  return {std::move(a), std::move(b)};
}

}  // namespace atl::testing
