#include "graph/training/run_records.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "graph/checkpoint/durable_file.hpp"
#include "graph/config.hpp"
#include "graph/data/data_source.hpp"
#include "graph/models/model.hpp"
#include "graph/training/engine.hpp"

namespace atl {

namespace fs = std::filesystem;

nlohmann::json run_record(const RunConfig& config, const Model& model, const TrainingEngine& engine,
                          const DataSource& data, const std::string& cpu_kernel, int threads,
                          const std::string& began_from) {
  nlohmann::json run;
  run["config"] = to_json(config);
  run["model"] = {{"family", model.family()}, {"preset", model.preset()}, {"parameters", model.parameter_count()}};
  run["engine"] = engine.name();
  run["cpu_kernel"] = cpu_kernel;
  run["compute_threads"] = threads;
  run["data"] = data.describe();
  // The file's content, to tell another file of the same name or kind from this one (a resume
  // into this run_dir compares it with the checkpoint's cursor).
  if (const nlohmann::json cursor = data.cursor(); cursor.is_object() && cursor.contains("file_hash")) {
    run["data_file_hash"] = cursor.at("file_hash");
  }
  if (!began_from.empty()) run["began_from"] = began_from;
  if (auto h = data.entropy_nats_per_token()) run["entropy_nats_per_token"] = *h;
  return run;
}

MetricsHistory read_metrics_history(const fs::path& path, std::int64_t first_step) {
  MetricsHistory out;
  std::ifstream old(path);
  std::int64_t number = 0;
  for (std::string line; std::getline(old, line);) {
    ++number;
    if (!nlohmann::json::accept(line)) continue;  // cut short by a crash: not history
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.is_object() || !record.contains("step") || !record.at("step").is_number_integer()) {
      throw ConfigError(path.string(), "line " + std::to_string(number),
                        "expected a step's record (a JSON object with an integer \"step\"); the file is not "
                        "a metrics.jsonl atoll wrote (move it away: the resumed run then starts a new one)");
    }
    (record.at("step").get<std::int64_t>() < first_step ? out.kept : out.cut) += line + "\n";
  }
  return out;
}

bool held_no_targets(const StepResult& r) {
  // (A batch without targets whose norm is NaN, from NaN weights, stays a non-finite step.)
  return !r.applied && r.nonfinite.empty();
}

nlohmann::json step_record(const StepResult& r, std::int64_t tokens_total, double step_seconds, double elapsed_s,
                           std::int64_t skipped) {
  nlohmann::json line = {{"step", r.step},           {"loss", r.loss},       {"grad_norm", r.grad_norm},
                         {"lr", r.lr},               {"tokens", tokens_total}, {"targets", r.targets},
                         {"bytes_gathered", r.bytes_gathered}, {"bytes_reduced", r.bytes_reduced},
                         {"bytes_dispatch", r.bytes_dispatch}, {"bytes_combine", r.bytes_combine},
                         {"tokens_per_s", static_cast<double>(r.tokens) / std::max(step_seconds, 1e-9)},
                         {"elapsed_s", elapsed_s}};
  // Router load per MoE layer: the busiest expert's tokens over the mean (1 = balanced).
  if (!r.expert_load.empty()) line["expert_load"] = r.expert_load;
  if (held_no_targets(r)) {
    line["no_targets"] = true;
  } else if (!r.applied) {
    line["skipped"] = true;  // a non-finite loss or norm is written as null
    line["skipped_steps"] = skipped;
    line["nonfinite"] = r.nonfinite;
  }
  return line;
}

void append_metrics_line(std::ofstream& metrics, const fs::path& path, const nlohmann::json& line,
                         std::int64_t step) {
  std::error_code size_ec;
  const std::uintmax_t size_before = fs::file_size(path, size_ec);
  errno = 0;
  metrics << line.dump() << "\n" << std::flush;
  if (metrics) return;
  // The record of the run cannot go on: stop rather than train unrecorded. What reached the file
  // of this line (a full disk takes part of it) is cut off again.
  const int error = errno;
  metrics.close();
  if (!size_ec) fs::resize_file(path, size_before, size_ec);
  const std::string cut = size_ec ? "; what reached the file of that line may remain (cutting it off failed: " +
                                        size_ec.message() + ")"
                                  : "";
  throw FileWriteError(fmt::format("{}: cannot append step {}'s line: {}{}", path.string(), step,
                                   error != 0 ? std::strerror(error) : "the stream failed", cut));
}

}  // namespace atl
