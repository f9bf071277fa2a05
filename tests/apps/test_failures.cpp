// atoll-train when training goes wrong or is stopped (docs/failures.md): non-finite losses and
// gradients, skipped steps.
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/apps/app_test_support.hpp"

namespace fs = std::filesystem;
using namespace atl::testing;

namespace {

// A small Beam run in `dir` with the given overrides (a sim mesh of 2 ranks unless overridden).
std::vector<std::string> small_run(const fs::path& dir, std::vector<std::string> sets) {
  std::vector<std::string> args = {source_path("configs/beam-tiny.yaml").string(),
                                   "--set",
                                   "run_dir=" + (dir / "run").string(),
                                   "--set",
                                   "checkpoint.dir=" + (dir / "ckpt").string(),
                                   "--set",
                                   "checkpoint.every=1",
                                   "--set",
                                   "train.steps=4",
                                   "--set",
                                   "train.log_every=1"};
  for (auto& s : sets) {
    args.push_back("--set");
    args.push_back(std::move(s));
  }
  return args;
}

std::size_t checkpoints_in(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind("step-", 0) == 0;
  return n;
}

}  // namespace

TEST_CASE("failures: a non-finite gradient stops the run with exit 3 before it is applied or saved",
          "[apps][failures]") {
  TempDir tmp;
  const Result r = run_app("atoll-train", small_run(tmp.path, {"model.init_std=1.0e30"}), tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("step 1:") != std::string::npos);
  CHECK(r.err.find("gradient norm is") != std::string::npos);
  CHECK(r.err.find("first non-finite gradient: model.") != std::string::npos);
  CHECK(checkpoints_in(tmp.path / "ckpt") == 0);  // no checkpoint of the poisoned state
  const auto metrics = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(metrics.size() == 1);
  CHECK(metrics[0]["skipped"] == true);
  CHECK(metrics[0]["grad_norm"].is_null());
}

TEST_CASE("failures: a learning rate that blows up stops at the first non-finite step and keeps the earlier checkpoints",
          "[apps][failures]") {
  TempDir tmp;
  const Result r =
      run_app("atoll-train", small_run(tmp.path, {"train.lr=1.0e30", "topology.engine=reference",
                                                  "topology.mesh.dp_shard=1", "train.warmup=0"}),
              tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  const auto metrics = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(metrics.size() >= 2);
  const std::int64_t bad = metrics.back()["step"].get<std::int64_t>();
  CHECK(r.err.find("step " + std::to_string(bad) + ":") != std::string::npos);
  for (std::size_t i = 0; i + 1 < metrics.size(); ++i) CHECK_FALSE(metrics[i].contains("skipped"));
  CHECK(checkpoints_in(tmp.path / "ckpt") == static_cast<std::size_t>(bad - 1));  // the good steps only
}

TEST_CASE("failures: on_nonfinite skip_step drops steps and stops after max_skipped_steps", "[apps][failures]") {
  TempDir tmp;
  const Result r = run_app(
      "atoll-train",
      small_run(tmp.path, {"model.init_std=1.0e30", "train.on_nonfinite=skip_step", "train.max_skipped_steps=2"}),
      tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("more than train.max_skipped_steps (2)") != std::string::npos);
  CHECK(r.out.find("skipped:") != std::string::npos);
  const auto metrics = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(metrics.size() == 3);
  for (std::size_t i = 0; i < metrics.size(); ++i) CHECK(metrics[i]["skipped_steps"] == i + 1);
  // Skipped steps leave the state untouched, so their checkpoints hold the initial weights.
  CHECK(checkpoints_in(tmp.path / "ckpt") == 2);
}

TEST_CASE("failures: train.on_nonfinite accepts stop and skip_step only", "[apps][failures]") {
  TempDir tmp;
  const Result r = run_app("atoll-train", small_run(tmp.path, {"train.on_nonfinite=ignore"}), tmp.path);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("train.on_nonfinite") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "run"));
}
