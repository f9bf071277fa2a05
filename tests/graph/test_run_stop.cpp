// How the run loop ends a job-wide stop (a signal to one process of a multi-process job): every
// process stops after the same step, and each says whether the signal reached it.
#include <catch2/catch.hpp>

#include <sstream>
#include <stdexcept>

#include "graph/config.hpp"
#include "graph/training/run.hpp"
#include "tests/graph/checkpoint_test_support.hpp"
#include "tests/support/source_tree.hpp"

using namespace atl;

namespace {

// The reference trainer as one process of a job whose processes agree on a stop: at step
// `job_stop_step` the step's collective reports another process's SIGTERM, and `during_step` runs
// inside that step (where this process's own copy of the signal may land).
class JobStopEngine : public TrainingEngine {
 public:
  JobStopEngine(std::unique_ptr<TrainingEngine> inner, std::int64_t job_stop_step, std::function<void()> during_step)
      : inner_(std::move(inner)), job_stop_step_(job_stop_step), during_step_(std::move(during_step)) {}
  const char* name() const override { return "job-stop"; }
  StepResult step(const Batch& rows, bool record_routing) override {
    StepResult r = inner_->step(rows, record_routing);
    if (r.step == job_stop_step_) {
      during_step_();
      r.stop_signal = 15;
    }
    if (requested_ != 0) r.stop_signal = requested_;
    return r;
  }
  bool agrees_on_stop() const override { return true; }
  void request_stop(int signal) override { requested_ = signal; }
  TrainingState state() const override { return inner_->state(); }

 private:
  std::unique_ptr<TrainingEngine> inner_;
  std::int64_t job_stop_step_;
  std::function<void()> during_step_;
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
