// A training run end to end: validate the config against what the engine can run, build the
// model and data, then step, report progress and write run_dir/{run.json, metrics.jsonl}.
#pragma once
#include <iosfwd>
#include <string>

#include "graph/config.hpp"

namespace atl {

struct RunOptions {
  bool overwrite = false;  // replace the outputs of an earlier run in run_dir
};

// Throws ConfigError (bad config or an engine that cannot run this mesh) before anything is
// written to run_dir; other exceptions are runtime failures. Returns the final mean loss.
double run_training(const RunConfig& config, const RunOptions& options, std::ostream& out);

}  // namespace atl
