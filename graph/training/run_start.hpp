// Where a run starts, and what it finds in and does to run_dir and checkpoint.dir before its
// first step: the writer (a single process, or node 0 of a job) finds the checkpoint to resume,
// checks it may write its outputs without replacing anything it was not told to, and reads the
// starting point; other nodes receive it.
#pragma once
#include <iosfwd>
#include <string>

#include "graph/config.hpp"
#include "graph/models/model.hpp"
#include "graph/training/run.hpp"
#include "graph/training/starting_point.hpp"

namespace atl {

// The writer's start. The checkpoint: --resume DIR; a bare --resume, the latest complete one under
// checkpoint.dir (ConfigError if none; an import at step 0 is no run to continue); --resume-if-any
// with none, the checkpoint run_dir's run.json says this same config began from ("began_from",
// recorded for a start from a checkpoint outside checkpoint.dir or an import), else a fresh start.
// A fresh start
// is refused (ConfigError, nothing written) when run_dir holds a run's metrics.jsonl or
// checkpoint.dir holds a run's checkpoints, unless --overwrite says to replace them, or, for
// --resume-if-any, run_dir's run.json is this same config (a job restarted before its first
// checkpoint: starting again reproduces it).
StartingPoint writer_starting_point(const RunConfig& config, const RunOptions& options, const Model& model);

// A multi-process job (options.from_writer): node 0 computes writer_starting_point and hands it to
// every other node, or hands on why it could not (every node then throws StartFailed or the error).
StartingPoint shared_starting_point(const RunConfig& config, const RunOptions& options, const Model& model);

// The writer, once everything is validated and just before the first step. A run resumed from
// step N moves checkpoint.dir's later checkpoints (a timeline it leaves; a bare --resume must not
// pick them) into checkpoint.dir/superseded-at-step-N-<time>, with `cut_metrics` (the metrics
// lines after N) beside them: nothing is lost. A fresh run with --overwrite removes the
// checkpoints of the run it replaces. Says what it did on `out`.
void prepare_checkpoint_dir(const RunConfig& config, const RunOptions& options, const StartingPoint& start,
                            const std::string& cut_metrics, std::ostream& out);

}  // namespace atl
