// How the run loop ends a job-wide stop (a signal to one process of a multi-process job): every
// process stops after the same step, and each says whether the signal reached it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "graph/config.hpp"
#include "graph/training/run.hpp"
#include "tests/graph/checkpoint_test_support.hpp"
#include "tests/support/source_tree.hpp"

using namespace atl;

namespace {

// The reference trainer as one process of a job whose processes agree on a stop: at step
// `job_stop_step` the step's collective reports another process's `job_signal` (0: none), and
// `during_step` runs inside that step (where this process's own copy of the signal may land).
// With `agrees` false it stands for a single-process engine (a stop ends the run between steps).
class JobStopEngine : public TrainingEngine {
 public:
  JobStopEngine(std::unique_ptr<TrainingEngine> inner, std::int64_t job_stop_step, std::function<void()> during_step,
                int job_signal = 15, bool agrees = true)
      : inner_(std::move(inner)),
        job_stop_step_(job_stop_step),
        during_step_(std::move(during_step)),
        job_signal_(job_signal),
        agrees_(agrees) {}
  const char* name() const override { return "job-stop"; }
  StepResult step(const Batch& rows, bool record_routing) override {
    StepResult r = inner_->step(rows, record_routing);
    if (r.step == job_stop_step_) {
      during_step_();
      r.stop_signal = job_signal_;
    }
    if (requested_ != 0) r.stop_signal = requested_;
    return r;
  }
  bool agrees_on_stop() const override { return agrees_; }
  void request_stop(int signal) override { requested_ = signal; }
  TrainingState state() const override { return inner_->state(); }

 private:
  std::unique_ptr<TrainingEngine> inner_;
  std::int64_t job_stop_step_;
  std::function<void()> during_step_;
  int job_signal_;
  bool agrees_;
  int requested_ = 0;
};

// The message RunStopped carries when another process's SIGTERM ends the job after step 3 and
// this process's own copy (`own_copy`) lands during that step, or never.
std::string stop_message(bool own_copy) {
  checkpoint_testing::TempDir tmp;
  const RunConfig config = load_run_config(testing::source_path("configs/beam-tiny.yaml").string(),
                                           {"run_dir=" + (tmp.path / "run").string(), "train.steps=8",
                                            "checkpoint.every=0", "topology.engine=reference"});
  int own = 0;
  RunOptions options;
  options.stop_requested = [&own] { return own; };
  auto make_engine = [&](EngineInputs inputs) -> std::unique_ptr<TrainingEngine> {
    return std::make_unique<JobStopEngine>(make_reference_engine(std::move(inputs)), 3, [&] {
      if (own_copy) own = 15;
    });
  };
  std::ostringstream out;
  try {
    run_training(config, options, make_engine, out);
  } catch (const RunStopped& e) {
    CHECK(e.signal() == 15);
    return e.what();
  }
  FAIL("the run did not stop");
  return "";
}

}  // namespace

TEST_CASE("run: a job-wide stop names the signal as another process's only where this one was not sent it",
          "[run][signals]") {
  // Only another process was signalled: this one stops with the job after the same step.
  CHECK_THAT(stop_message(false),
             Catch::StartsWith("stopped by SIGTERM (sent to another process of the job) after step 3 of 8"));
  // This one's copy landed mid-step, after the other's request began the stop (a scheduler
  // signalling every process at once): it was reached, and says so.
  CHECK_THAT(stop_message(true), Catch::StartsWith("stopped by SIGTERM after step 3 of 8"));
}

TEST_CASE("run: a stop asked for as the data runs out (data.loop false) finishes the run, as every other process does",
          "[run][signals]") {
  checkpoint_testing::TempDir tmp;
  const std::filesystem::path text = tmp.path / "short.txt";
  {
    std::ofstream(text) << "A short text: fewer bytes than one step's 16 rows of 32 tokens.\n\nA second document.\n";
  }
  const RunConfig config = load_run_config(
      testing::source_path("configs/beam-tiny.yaml").string(),
      {"run_dir=" + (tmp.path / "run").string(), "train.steps=5", "checkpoint.every=0", "topology.engine=reference",
       "data.loop=false", "data.source=text:" + text.string()});
  // SIGINT lands during step 1, the last the text fills: the next step, which would carry the
  // stop to the other processes, is never taken (they finish): so does this one, and so does a
  // single process (as at train.steps).
  for (const bool agrees : {true, false}) {
    INFO("processes agree on the stop: " << agrees);
    int own = 0;
    RunOptions options;
    options.overwrite = true;  // (the second run replaces the first)
    options.stop_requested = [&own] { return own; };
    auto make_engine = [&](EngineInputs inputs) -> std::unique_ptr<TrainingEngine> {
      return std::make_unique<JobStopEngine>(make_reference_engine(std::move(inputs)), 1, [&] { own = 2; }, 0, agrees);
    };
    std::ostringstream out;
    CHECK_NOTHROW(run_training(config, options, make_engine, out));
    CHECK_THAT(out.str(), Catch::Contains("the data ran out after step 1") &&
                              Catch::Contains("(SIGINT came as the run ended: nothing to stop)") &&
                              Catch::Contains("final loss="));
  }
}
