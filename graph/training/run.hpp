// A training run end to end: validate the config against what the engine can run, build the
// model and data, then step, report progress and write run_dir/{run.json, metrics.jsonl}.
#pragma once
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/plan/mesh.hpp"
#include "graph/models/model.hpp"
#include "graph/training/engine.hpp"
#include "graph/training/starting_point.hpp"

namespace atl {

// A step's loss or gradient norm was not finite (and train.on_nonfinite said stop, or too many
// steps were skipped). Nothing was applied; atoll-train exits with code 3.
class NonFiniteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A step's update, its loss and gradient norm finite, left weights or moments non-finite (a
// learning rate far too large), found when saving them: no checkpoint was written; exit code 3.
// Node 0 alone finds it (it alone holds the whole state).
class DivergedWeights : public NonFiniteError {
 public:
  using NonFiniteError::NonFiniteError;
};

// --resume-if-any found the run finished (its latest checkpoint is at train.steps): nothing to do,
// and atoll-train exits 0 (a launcher or scheduler restarting a job that had already ended).
class RunFinished : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run stopped early because a signal asked it to (after finishing a step and saving a
// checkpoint when checkpoints are configured). atoll-train exits with 128 + signal.
class RunStopped : public std::runtime_error {
 public:
  RunStopped(int signal, const std::string& what) : std::runtime_error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// "SIGTERM", "SIGINT", else the number: how stop messages name the signal.
std::string stop_signal_name(int signal);

struct RunOptions {
  bool overwrite = false;  // replace the outputs of an earlier run in run_dir
  std::string trace_path;  // write a Chrome trace-event JSON here at the end (engines that record one)
  // Continue from a checkpoint (optimizer state, step, data position): a checkpoint directory, or
  // "" for the latest complete one under checkpoint.dir. Unset: start fresh.
  std::optional<std::string> resume;
  // With resume "": start fresh when checkpoint.dir holds no complete checkpoint yet (a launcher
  // restarting a failed job) instead of failing.
  bool resume_if_any = false;
  // Polled after every step: a non-zero signal number ends the run there (RunStopped).
  std::function<int()> stop_requested;
  // Writes run_dir (run.json, metrics.jsonl), checkpoints and the trace: node 0 of a multi-process
  // job. Every other process takes part in every collective (checkpoints' included) and writes
  // nothing.
  bool writer = true;
  // The ranks this process runs: a node's share of a multi-process job's mesh; 0 for every rank
  // of the mesh (sim) or the reference engine's one. Sizes compute.threads' default and the
  // memory preflight.
  int ranks_here = 0;
  // Called by the writer once it has prepared run_dir and checkpoint.dir, before the first step:
  // from then on a restart must resume the latest checkpoint rather than repeat this start's
  // --resume DIR or --overwrite (scripts/launch).
  std::function<void()> started;
  // A multi-process job: set, node 0 alone finds and reads the checkpoint to start from and hands
  // its starting point to the others through these collectives, so they need no view of
  // checkpoint.dir and cannot start anywhere else.
  std::optional<StartHandOver> from_writer;
};

struct EngineInputs {
  const RunConfig& config;
  std::shared_ptr<const Model> model;
  // fp32, full; empty: a fresh model, which each engine generates itself from train.seed and the
  // model's init_std (the actor runtime shard by shard: no process holds the whole model).
  TensorMap initial_master;
  OptimizerSettings optimizer;
  // Resuming: AdamW moments (empty = zeros) and the steps already taken.
  TensorMap initial_exp_avg{}, initial_exp_avg_sq{};
  std::int64_t start_step = 0;
  // Record trace spans for chrome_trace() (--trace). Off by default: every step adds a span per
  // op, gather and reduction of every rank, which a long run would hold in memory to the end.
  bool trace = false;
  // Keep every collective's record for the engine's collective_records() (tests): a long run
  // would hold hundreds per step to the end. The per-step traffic counts need none.
  bool keep_collective_records = false;
};
// Builds the engine a config asks for; throws ConfigError when it cannot run the config.
using EngineFactory = std::function<std::unique_ptr<TrainingEngine>(EngineInputs)>;

// The single-process reference trainer; it runs a 1-rank mesh.
std::unique_ptr<TrainingEngine> make_reference_engine(EngineInputs inputs);
// The initial moments of EngineInputs: the given ones, or zeros.
TensorMap initial_moments(const TensorMap& given, const std::vector<ParamSpec>& specs);
OptimizerSettings optimizer_settings(const TrainConfig& train);
// compute.bf16_gemm for every kernel of this process; ConfigError where amx is asked for and the
// CPU or OS lacks it.
void use_bf16_gemm(const RunConfig& config);
// compute.threads resolved: the configured count, or the default for the ranks this process runs
// (ranks_in_process) -- kernels/cpu/compute_pool.hpp.
int compute_threads(const RunConfig& config, int ranks_here = 0);
// The ranks this process runs: `ranks_here` when given (RunOptions), else 1 for the reference
// engine and the whole mesh for the sim.
int ranks_in_process(const RunConfig& config, int ranks_here = 0);
// The micro-batches each data-parallel rank runs per step; ConfigError (train.global_batch) unless
// the global batch splits into whole micro-batches for every rank.
int micro_batches_per_rank(const RunConfig& config, const Mesh& mesh);

// Throws ConfigError (bad config or an engine that cannot run this mesh) before anything is
// written to run_dir; other exceptions are runtime failures. Returns the final mean loss.
double run_training(const RunConfig& config, const RunOptions& options, const EngineFactory& make_engine,
                    std::ostream& out);

}  // namespace atl
