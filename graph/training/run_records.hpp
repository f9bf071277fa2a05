// What a training run writes into run_dir besides checkpoints: run.json (what ran: config, model,
// engine, kernels, data) and metrics.jsonl (one JSON line per step, appended and flushed as the
// step ends, so a crash keeps every finished step).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace atl {

struct RunConfig;
class Model;
class TrainingEngine;
class DataSource;
struct StepResult;

// run.json's contents (`began_from`: the checkpoint a run not continuing checkpoint.dir began
// from, else "").
nlohmann::json run_record(const RunConfig& config, const Model& model, const TrainingEngine& engine,
                          const DataSource& data, const std::string& cpu_kernel, int threads,
                          const std::string& began_from);

// A resumed run's metrics.jsonl, split at the resumed step: `kept` the lines before first_step
// (the history the run continues), `cut` the lines from it on (kept with the checkpoints set
// aside). A line cut short by a crash is neither. Throws ConfigError naming the file and line for a
// whole line that is not a step's record. A missing file is empty.
struct MetricsHistory {
  std::string kept, cut;
};
MetricsHistory read_metrics_history(const std::filesystem::path& path, std::int64_t first_step);

// One step's line. `tokens_total`: tokens trained on so far (this step's included); `skipped`: the
// steps skipped as non-finite so far (written only for a skipped step).
nlohmann::json step_record(const StepResult& r, std::int64_t tokens_total, double step_seconds, double elapsed_s,
                           std::int64_t skipped);
// A step that was not applied although nothing was non-finite: its batch held no target.
bool held_no_targets(const StepResult& r);

// Appends `line` to the open `metrics` (at `path`) and flushes. A failed write is cut off again,
// so the file stays whole lines, and ends in FileWriteError naming the file and the step.
void append_metrics_line(std::ofstream& metrics, const std::filesystem::path& path, const nlohmann::json& line,
                         std::int64_t step);

}  // namespace atl
