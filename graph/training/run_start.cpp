#include "graph/training/run_start.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/durable_file.hpp"
#include "graph/checkpoint/json_file.hpp"
#include "graph/checkpoint/model_weights.hpp"
#include "graph/data/data_source.hpp"
#include "graph/data/file_sources.hpp"
#include "graph/models/model.hpp"
#include "graph/training/exit_code.hpp"
#include "graph/training/output_path.hpp"

namespace atl {

namespace {

namespace fs = std::filesystem;

void check_outputs(const RunConfig& config, const RunOptions& options) {
  check_output_path(config.run_dir, false, config.source_file, "run_dir");
  // The files the run writes there: a directory in their place is bad input, found before any
  // write (else the first rename into place failed mid-run, exit 1).
  for (const char* name : {"metrics.jsonl", "run.json"}) {
    const fs::path file = fs::path(config.run_dir) / name;
    std::error_code ec;
    if (fs::is_directory(file, ec)) {
      throw ConfigError(config.source_file, "run_dir", "'" + file.string() + "' is a directory; the run writes its " +
                                                           name + " there");
    }
  }
  if (config.checkpoint.every > 0) check_output_path(config.checkpoint.dir, false, config.source_file, "checkpoint.dir");
  if (options.trace_path.empty()) return;
  if (config.topology.engine == Engine::reference) {  // found now, not after the whole run has trained
    throw ConfigError(config.source_file, "topology.engine",
                      "--trace records the actor runtime's spans; the reference engine has none (expected "
                      "topology.engine: actors, or no --trace)");
  }
  check_output_path(options.trace_path, true, config.source_file, "--trace");
  // The trace is written at the end: over an input, the run would destroy what it started from.
  const fs::path run_dir(config.run_dir);
  check_replaces_no_input(options.trace_path,
                          {{config.source_file, "the config file", false},
                           {config.data.path, "the data file (data.source)", false},
                           {(run_dir / "metrics.jsonl").string(), "the run's metrics.jsonl", false},
                           {(run_dir / "run.json").string(), "the run's run.json", false},
                           {config.checkpoint.load, "the checkpoint.load directory", true},
                           {config.checkpoint.dir, "the checkpoint.dir directory", true},
                           {options.resume.value_or(""), "the --resume directory", true}},
                          config.source_file, "--trace");
}

// The run recorded in run_dir (run.json), if it can be read as one.
std::optional<nlohmann::json> recorded_run(const RunConfig& config) {
  std::optional<nlohmann::json> run = json_if_readable(fs::path(config.run_dir) / "run.json");
  if (!run || !run->is_object() || !run->contains("config") || !run->at("config").is_object()) return std::nullopt;
  run->at("config") = saved_config_as_read(run->at("config"));
  return run;
}

// A resolved config as the run it describes: where the file was read from (source_file) is no
// part of it (a restart may name the same config from another directory).
nlohmann::json run_identity(nlohmann::json resolved) {
  resolved.erase("source_file");
  return resolved;
}

// --resume-if-any with nothing saved under checkpoint.dir: the checkpoint the run recorded in
// run_dir began from (run.json's "began_from"), when that run is this config's. A restart before
// the first save of a run begun from another run's checkpoint (or an import) begins there again,
// not from a fresh model.
// A run recorded as finished (run.json's "finished") has nothing to do: RunFinished.
std::optional<fs::path> recorded_beginning(const RunConfig& config) {
  const std::optional<nlohmann::json> run = recorded_run(config);
  if (!run || run_identity(run->at("config")) != run_identity(to_json(config))) return std::nullopt;
  const fs::path file = fs::path(config.run_dir) / "run.json";
  if (run->contains("finished") && run->at("finished") == true) {
    throw RunFinished("nothing to do: " + file.string() + " records this run as finished (train.steps " +
                      std::to_string(config.train.steps) + "), and it saved no checkpoint to continue from");
  }
  if (!run->contains("began_from")) return std::nullopt;
  const nlohmann::json& began = run->at("began_from");
  if (!began.is_string() || began.get<std::string>().empty()) {
    throw ConfigError(file.string(), "began_from", "expected the path of the checkpoint the run began from, found " +
                                                       began.dump());
  }
  const fs::path dir = began.get<std::string>();
  if (!fs::is_directory(dir)) {
    throw ConfigError(file.string(), "began_from",
                      "the run began from '" + dir.string() + "', which is no longer a directory, and saved no "
                      "checkpoint of its own under '" + config.checkpoint.dir + "': --resume-if-any has nothing to "
                      "continue from (restore that checkpoint, or start again with --overwrite)");
  }
  return dir;
}

// The first value that differs between two configs (or sections of one): its dotted key below
// `prefix` ("train.steps") and both values (null where a side lacks the key).
struct ConfigChange {
  std::string key;
  const nlohmann::json *was = nullptr, *now = nullptr;
};
ConfigChange first_change(const nlohmann::json& was, const nlohmann::json& now, const std::string& prefix) {
  if (was.is_object() && now.is_object()) {
    for (const auto& [k, v] : now.items()) {
      const std::string key = prefix.empty() ? k : prefix + "." + k;
      if (!was.contains(k)) return {key, nullptr, &v};
      if (was.at(k) != v) return first_change(was.at(k), v, key);
    }
    for (const auto& [k, v] : was.items()) {
      if (!now.contains(k)) return {prefix.empty() ? k : prefix + "." + k, &v, nullptr};
    }
  }
  return {prefix, &was, &now};
}

// Whether `dir` is one of checkpoint.dir's own checkpoints (a step of the run kept there).
bool in_checkpoint_dir(const RunConfig& config, const fs::path& dir) {
  std::error_code ec;
  const fs::path parent = fs::weakly_canonical(normalised_directory(dir), ec).parent_path();
  return !ec && parent == fs::weakly_canonical(normalised_directory(config.checkpoint.dir), ec) && !ec;
}

// Whether `dir` is an imported checkpoint (atoll-convert import: step 0, no run to continue); an
// unreadable state is left for the load to report.
bool is_import(const fs::path& dir) {
  const std::optional<nlohmann::json> state = json_if_readable(dir / "trainer_state.json");
  return state && state->is_object() && state->contains("imported_from");
}

nlohmann::json data_as_read(nlohmann::json data, const nlohmann::json& cursor);

// The train keys that make a run another run (with its model and data): the checkpoint's run and
// the one run_dir records are compared on the same ones.
constexpr const char* kRunTrainKeys[] = {"seed", "global_batch", "seq_len"};

// The writer's outputs can be made: usable paths, and, for a fresh start (or one from an import),
// no earlier run in run_dir or checkpoint.dir unless --overwrite says to replace it. (Checks only:
// nothing is written. A resume's run_dir: check_run_dir_holds_this_run, once the checkpoint agrees.)
void check_writer_outputs(const RunConfig& config, const RunOptions& options, bool resuming,
                          const std::string& context) {
  check_outputs(config, options);
  if (resuming || options.overwrite) {
    if (!resuming && !config.checkpoint.load.empty()) {
      // --overwrite removes checkpoint.dir's checkpoints: never the weights this run starts from.
      const fs::path load = fs::weakly_canonical(config.checkpoint.load);
      for (const fs::path& dir : checkpoints_after(config.checkpoint.dir, 0)) {
        if (fs::weakly_canonical(dir) == load) {
          throw ConfigError(config.source_file, "checkpoint.load",
                            "'" + config.checkpoint.load + "' is a checkpoint of the run --overwrite replaces (under "
                            "checkpoint.dir '" + config.checkpoint.dir + "'); copy it elsewhere first, or set "
                            "another checkpoint.dir");
        }
      }
    }
    return;
  }
  if (fs::exists(fs::path(config.run_dir) / "metrics.jsonl")) {
    std::string why = "'" + config.run_dir + "' already holds a run (metrics.jsonl); pass --overwrite to replace it";
    if (options.resume_if_any) {
      // A job restarted before its first checkpoint starts again: the same config reproduces it.
      const std::optional<nlohmann::json> recorded = recorded_run(config);
      const nlohmann::json now = run_identity(to_json(config));
      if (recorded && run_identity(recorded->at("config")) == now) return;
      const std::string found =
          recorded ? "has another config: " + first_change(run_identity(recorded->at("config")), now, "").key + " differs"
                   : std::string("is missing or unreadable");
      why += fmt::format(" (--resume-if-any found no checkpoint under '{}', and run.json {})", config.checkpoint.dir,
                         found);
    }
    throw ConfigError(config.source_file, "run_dir", why + context);
  }
  // Step 0 is an import's (weights to start from), never a run's save.
  if (const std::vector<fs::path> earlier = checkpoints_after(config.checkpoint.dir, 0); !earlier.empty()) {
    throw ConfigError(config.source_file, "checkpoint.dir",
                      "'" + config.checkpoint.dir + "' holds checkpoints of an earlier run (up to " +
                          earlier.back().filename().string() + "), which a later --resume would mix with this "
                          "run; pass --resume to continue that run, --overwrite to replace it (its checkpoints "
                          "are removed), or set another checkpoint.dir" + context);
  }
}

// The checkpoint the writer resumes from, or none for a fresh start. A bare --resume takes the
// latest a run saved (steps from 1): an import (step 0) is weights to start from, not a run.
std::optional<fs::path> resume_source(const RunConfig& config, const RunOptions& options) {
  if (!options.resume) return std::nullopt;
  if (!options.resume->empty()) return fs::path(*options.resume);
  if (const auto saved = checkpoints_after(config.checkpoint.dir, 0); !saved.empty()) return saved.back();
  // Nothing saved yet: where the run began (its recorded checkpoint, else a fresh model).
  if (options.resume_if_any) return recorded_beginning(config);
  throw ConfigError(config.source_file, "checkpoint.dir",
                    "--resume found no complete checkpoint under '" + config.checkpoint.dir + "'");
}

// A saved config value ("train.seed" in trainer_state.json's "config"); CheckpointError naming the
// file and key when it is missing (a damaged or foreign file).
const nlohmann::json& saved_value(const nlohmann::json& saved, const std::string& section, const char* key,
                                  const fs::path& dir) {
  const std::string name = key ? section + "." + key : section;
  const bool found = saved.contains(section) && (!key || (saved.at(section).is_object() && saved.at(section).contains(key)));
  if (!found) {
    throw CheckpointError((dir / "trainer_state.json").string() + ": \"config\" has no " + name +
                          "; --resume cannot tell whether this config continues its run");
  }
  return key ? saved.at(section).at(key) : saved.at(section);
}

// The model a config's "model" section (to_json's form: family, preset and overrides) resolves to
// (its config.json fields); nullopt when it names none (a foreign or damaged section).
std::optional<nlohmann::json> resolved_model(const nlohmann::json& section, const std::string& file) {
  try {
    ModelSection model;
    model.family = section.value("family", "");
    model.preset = section.value("preset", "");
    model.overrides = YAML::Node(YAML::NodeType::Map);
    for (const auto& [key, value] : section.items()) {
      if (key != "family" && key != "preset") model.overrides[key] = YAML::Load(value.dump());  // JSON is YAML
    }
    return make_model(model, file)->hf_config();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A resume continues run_dir's records (metrics.jsonl up to the resumed step, run.json): a run_dir
// that holds another run (another seed, model, batch shape or data in its run.json) would get this
// run's steps spliced onto its own and its record replaced. Called once the checkpoint's run is
// known to be this config's (check_same_run), so a difference here is run_dir's, not a changed
// setting; --overwrite does not act on a resume of checkpoint.dir's own checkpoints.
// `cursor`: the checkpoint's data cursor (a file source's holds its content hash).
void check_run_dir_holds_this_run(const RunConfig& config, const std::optional<nlohmann::json>& cursor) {
  if (!fs::exists(fs::path(config.run_dir) / "metrics.jsonl")) return;
  const std::optional<nlohmann::json> recorded = recorded_run(config);
  if (!recorded) return;  // (no record to compare: the metrics are kept up to the resumed step)
  const nlohmann::json& was = recorded->at("config");
  const nlohmann::json now = to_json(config);
  auto refuse = [&](const std::string& key, const std::string& theirs, const std::string& ours) {
    throw ConfigError(config.source_file, "run_dir",
                      fmt::format("'{}' holds another run (its run.json has {} {}, this run {}): --resume would "
                                  "write this run's steps over its records; set run_dir to the resumed run's, or to "
                                  "a new folder",
                                  config.run_dir, key, theirs, ours));
  };
  for (const char* key : kRunTrainKeys) {
    const nlohmann::json::json_pointer at("/train/" + std::string(key));
    if (was.contains(at) && was.at(at) != now.at(at)) refuse(std::string("train.") + key, was.at(at).dump(), now.at(at).dump());
  }
  if (was.contains("model") && was.at("model").is_object()) {
    const std::optional<nlohmann::json> theirs = resolved_model(was.at("model"), config.source_file);
    if (theirs && *theirs != resolved_model(now.at("model"), config.source_file)) {
      refuse("model", was.at("model").dump(), now.at("model").dump());
    }
  }
  // The data as read, a file's path elided (run.json wrote it as that run's working directory
  // saw it; the checkpoint's content hash checks the file itself), key by key: a key an older
  // build did not write is no difference.
  if (was.contains("data") && was.at("data").is_object()) {
    const nlohmann::json path_elided = {{"file_hash", true}};
    const nlohmann::json theirs = data_as_read(was.at("data"), path_elided),
                         ours = data_as_read(now.at("data"), path_elided);
    for (const auto& [key, value] : theirs.items()) {
      if (ours.contains(key) && ours.at(key) != value) refuse("data." + key, value.dump(), ours.at(key).dump());
    }
  }
  // Another file of the same kind: run.json records the content hash of the file it read.
  const auto hash = recorded->find("data_file_hash");
  if (hash != recorded->end() && cursor && cursor->is_object() && cursor->contains("file_hash") &&
      cursor->at("file_hash") != *hash) {
    refuse("a data file of content hash", hash->dump(), cursor->at("file_hash").dump());
  }
}

// The model section less the overrides that leave its preset's model as it is ("hidden_size: 64"
// on a preset of hidden size 64), and with the preset named as resolved: two sections naming the
// same model by different words compare equal here, and what differs is a key that matters.
nlohmann::json effective_model_section(const nlohmann::json& section, const std::string& file) {
  nlohmann::json base = {{"family", section.value("family", "")}, {"preset", section.value("preset", "")}};
  const std::optional<nlohmann::json> preset_model = resolved_model(base, file);
  if (!preset_model) return section;
  nlohmann::json out = base;
  for (const auto& [key, value] : section.items()) {
    if (key == "family" || key == "preset") continue;
    nlohmann::json one = base;
    one[key] = value;
    if (resolved_model(one, file) != preset_model) out[key] = value;  // a change alone, or one that needs others
  }
  return out;
}

// The data section is compared as the data it reads: a file source's path may be written another
// way (another working directory, an absolute path) when the cursor holds the file's content hash,
// which the restore checks; token_width 0 stands for the width the file's extension gives.
nlohmann::json data_as_read(nlohmann::json data, const nlohmann::json& cursor) {
  const std::string source = data.value("source", "");
  const std::size_t colon = source.find(':');
  if (colon == std::string::npos) return data;
  const std::string kind = source.substr(0, colon), path = source.substr(colon + 1);
  if (kind == "tokens" && data.contains("token_width") && data.at("token_width") == 0) {  // (any JSON type compares)
    try {
      data["token_width"] = resolved_token_width(path, 0);
    } catch (const DataError&) {  // left as written: the comparison shows it
    }
  }
  if (cursor.is_object() && cursor.contains("file_hash")) data["source"] = kind + ":";  // the path elided
  return data;
}

// The saved sections the comparison reads by kind: objects, and strings where it needs them (a
// damaged file would otherwise end in nlohmann's type_error: exit 1, no file or key named).
void check_saved_kinds(const nlohmann::json& saved, const fs::path& dir) {
  const std::string file = (dir / "trainer_state.json").string();
  for (const char* section : {"model", "data"}) {
    const auto it = saved.find(section);
    if (it == saved.end()) continue;  // saved_value names a missing one
    if (!it->is_object()) {
      throw CheckpointError(fmt::format("{}: \"config\".{} must be an object, got {}", file, section, it->type_name()));
    }
    for (const char* key : {"family", "preset", "source"}) {
      const auto field = it->find(key);
      if (field != it->end() && !field->is_string()) {
        throw CheckpointError(
            fmt::format("{}: \"config\".{}.{} must be a string, got {}", file, section, key, field->type_name()));
      }
    }
  }
}

// Resuming continues the same run: the model, the seed and the data must be those the checkpoint
// was saved with (anything else silently changes the batches). Imports carry no run to continue.
// The model is compared as resolved: an override equal to the preset's value changes nothing.
void check_same_run(const RunConfig& config, const Model& model, const nlohmann::json& trainer_state,
                    const fs::path& dir) {
  if (trainer_state.contains("imported_from")) return;
  const nlohmann::json saved = saved_config_as_read(trainer_state.at("config"));
  check_saved_kinds(saved, dir);
  nlohmann::json now = to_json(config);
  // A model section without a key has its preset's value (effective_model_section leaves it out);
  // another section simply had no such key.
  auto unset = [&](const nlohmann::json& side, const std::string& key, bool model) -> std::string {
    if (!model) return "no such key";
    const std::string leaf = key.substr(key.rfind('.') + 1), preset_name = side.value("preset", "");
    const std::optional<nlohmann::json> preset =
        resolved_model({{"family", side.value("family", "")}, {"preset", preset_name}}, config.source_file);
    const std::string whose = preset_name.empty() ? "the family's default" : "the preset's";
    return preset && preset->contains(leaf) ? preset->at(leaf).dump() + " (" + whose + ")" : whose + " value";
  };
  auto refuse = [&](const nlohmann::json& a, const nlohmann::json& b, const std::string& key) {
    const ConfigChange c = first_change(a, b, key);
    auto shown = [&](const nlohmann::json* v, const nlohmann::json& side) {
      return v ? v->dump() : unset(side, c.key, key == "model");
    };
    throw ConfigError(config.source_file, c.key,
                      "--resume continues the run saved in " + dir.string() + ", which had " + shown(c.was, a) +
                          "; this config has " + shown(c.now, b));
  };
  auto same = [&](const char* section, const char* key) {
    const nlohmann::json& a = saved_value(saved, section, key, dir);
    const nlohmann::json& b = key ? now.at(section).at(key) : now.at(section);
    if (a != b) refuse(a, b, key ? std::string(section) + "." + key : std::string(section));
  };
  const nlohmann::json& saved_model = saved_value(saved, "model", nullptr, dir);
  if (saved_model != now.at("model")) {
    const std::optional<nlohmann::json> was = resolved_model(saved_model, config.source_file);
    if (was != model.hf_config()) {  // (also when the saved section names no model: nullopt)
      const nlohmann::json a = effective_model_section(saved_model, config.source_file);
      const nlohmann::json b = effective_model_section(now.at("model"), config.source_file);
      refuse(a != b ? a : saved_model, a != b ? b : now.at("model"), "model");
    }
  }
  for (const char* key : kRunTrainKeys) same("train", key);
  const nlohmann::json no_cursor;
  const nlohmann::json& cursor = trainer_state.contains("data_cursor") ? trainer_state.at("data_cursor") : no_cursor;
  const nlohmann::json& saved_written = saved_value(saved, "data", nullptr, dir);
  const nlohmann::json saved_data = data_as_read(saved_written, cursor), now_data = data_as_read(now.at("data"), cursor);
  if (saved_data != now_data) {  // named as written when the source's kind differs, else as read
    const bool source = first_change(saved_data, now_data, "data").key == "data.source";
    refuse(source ? saved_written : saved_data, source ? now.at("data") : now_data, "data");
  }
}

// Settings a resumed run may change, each of which makes its steps differ from the saved run's
// continuation (train.steps moves the cosine schedule's end): named, so a change is never silent.
std::string changed_settings(const RunConfig& config, const nlohmann::json& trainer_state) {
  if (trainer_state.contains("imported_from")) return "";
  const nlohmann::json& saved = trainer_state.at("config");
  const nlohmann::json now = to_json(config);
  static const std::pair<const char*, const char*> keys[] = {
      {"train", "steps"},        {"train", "lr"},      {"train", "warmup"}, {"train", "min_lr_ratio"},
      {"train", "weight_decay"}, {"train", "beta1"},   {"train", "beta2"},  {"train", "adam_eps"},
      {"train", "grad_clip"},    {"train", "micro_batch"}, {"precision", nullptr}, {"compute", "bf16_gemm"}};
  const nlohmann::json chain = "chain";  // compute.bf16_gemm of checkpoints written before the key existed
  std::string changed;
  for (const auto& [section, key] : keys) {
    const bool gemm = std::string_view(section) == "compute";
    if (gemm && config.precision != Precision::bf16) continue;  // fp32 runs have no bf16 GEMMs
    const nlohmann::json* was = saved.contains(section) ? &saved.at(section) : nullptr;
    if (was && key) was = was->is_object() && was->contains(key) ? &was->at(key) : nullptr;
    if (!was && gemm) was = &chain;
    const nlohmann::json& is = key ? now.at(section).at(key) : now.at(section);
    if (was && *was != is) {
      changed += fmt::format("{}{}{}{} {} -> {}", changed.empty() ? "" : ", ", section, key ? "." : "",
                             key ? key : "", was->dump(), is.dump());
    }
  }
  return changed;
}

// A training checkpoint carries what a run needs to continue exactly; without it a resume would
// silently restart the data stream or the token count. (An import, at step 0, carries none.)
void check_resumable_state(const nlohmann::json& state, const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "trainer_state.json";
  if (state.contains("imported_from")) return;
  auto need = [&](const char* key, bool ok, const char* expected) {
    if (!state.contains(key)) {
      throw CheckpointError(fmt::format("{}: \"{}\" is missing (expected {}); --resume cannot continue the run",
                                        file.string(), key, expected));
    }
    if (!ok) throw CheckpointError(fmt::format("{}: \"{}\" must be {}", file.string(), key, expected));
  };
  need("data_cursor", state.contains("data_cursor") && state.at("data_cursor").is_object(), "a JSON object");
  need("tokens",
       state.contains("tokens") && state.at("tokens").is_number_integer() && state.at("tokens").get<std::int64_t>() >= 0,
       "a non-negative integer");
  need("config", state.contains("config") && state.at("config").is_object(), "the run's resolved config (an object)");
  need("seed", state.contains("seed") && state.at("seed").is_number_unsigned(), "a non-negative integer");
}

// Reads the starting point: the checkpoint resumed from, weights to fine-tune from, or a fresh init.
StartingPoint read_starting_point(const RunConfig& config, const RunOptions& options,
                                  const std::optional<fs::path>& resume_dir, const Model& model) {
  StartingPoint start;
  if (resume_dir) {
    const fs::path dir = *resume_dir;
    CheckpointContents c = load_checkpoint(dir);
    // The family, then the run's settings: a changed model is named by its key, not by a tensor's
    // shape.
    check_checkpoint_family(model, c, dir.string());
    check_resumable_state(c.trainer_state, dir);
    check_same_run(config, model, c.trainer_state, dir);
    TensorMap master = model_weights_from(model, c.model, dir.string());
    if (c.step == config.train.steps && options.resume_if_any) {
      throw RunFinished("nothing to do: the latest checkpoint, " + dir.string() + ", is at train.steps (" +
                        std::to_string(c.step) + "): the run has finished");
    }
    if (c.step >= config.train.steps) {
      throw ConfigError(config.source_file, "train.steps",
                        "the checkpoint " + dir.string() + " is at step " + std::to_string(c.step) +
                            "; expected train.steps above it to continue");
    }
    start.state = {c.step, std::move(master), model_weights_from(model, c.exp_avg, dir.string() + " (exp_avg)"),
                   model_weights_from(model, c.exp_avg_sq, dir.string() + " (exp_avg_sq)")};
    if (c.trainer_state.contains("data_cursor")) {
      start.data_cursor = c.trainer_state.at("data_cursor");
    }
    start.tokens = c.trainer_state.value("tokens", std::int64_t{0});
    start.description = "resumed from " + dir.string() + " at step " + std::to_string(c.step);
    start.changed_settings = changed_settings(config, c.trainer_state);
    start.model_changes = model_config_changes(model, c);  // (an import's: a resume's own are refused above)
    return start;
  }
  if (!config.checkpoint.load.empty()) {
    const CheckpointContents c = [&] {
      try {
        return load_checkpoint(config.checkpoint.load);
      } catch (const CheckpointError& e) {  // named by the config's key: the path alone may say little
        throw CheckpointError(config.source_file + ": checkpoint.load: " + e.what());
      }
    }();
    start.state.master = model_weights_from(model, c, config.checkpoint.load);
    start.description = "weights from " + config.checkpoint.load;
    start.model_changes = model_config_changes(model, c);
    return start;
  }
  return start;  // a fresh model: the engine generates it (empty master)
}

}  // namespace

StartingPoint writer_starting_point(const RunConfig& config, const RunOptions& options, const Model& model) {
  const std::optional<fs::path> from = resume_source(config, options);
  if (from) require_complete_checkpoint(*from);  // a root or a half-saved folder is named before anything else
  // Continuing the run kept in run_dir and checkpoint.dir: a checkpoint of checkpoint.dir, not an
  // import. Any other checkpoint starts a run here (from its state), with a fresh start's checks.
  const bool import = from && is_import(*from);
  const bool continues = from && !import && in_checkpoint_dir(config, *from);
  std::string context;
  if (from && !continues && !import) {
    context = " (--resume " + from->string() + " is not one of checkpoint.dir's checkpoints: continuing it here "
              "would mix two runs; resume it into an empty run_dir and checkpoint.dir)";
  }
  check_writer_outputs(config, options, continues, context);
  StartingPoint start = read_starting_point(config, options, from, model);
  if (continues) check_run_dir_holds_this_run(config, start.data_cursor);
  start.resumed = continues;
  if (from && !continues) start.began_from = fs::absolute(*from).lexically_normal().string();
  return start;
}

StartingPoint shared_starting_point(const RunConfig& config, const RunOptions& options, const Model& model) {
  const StartHandOver& link = *options.from_writer;
  StartingPoint start;
  if (options.writer) {
    std::vector<std::byte> header;
    try {
      start = writer_starting_point(config, options, model);  // a refusal reaches every node as node 0's reason
      header = encode_start_header(start);
    } catch (const std::exception& e) {
      link.bytes(encode_start_failure(e.what(), exit_code_for(e)));
      link.barrier();
      throw;
    }
    link.bytes(std::move(header));
  } else {
    // (A malformed header, which a node 0 of the same build never sends, ends this node here and
    // node 0 through the control plane.)
    try {
      start = decode_start_header(link.bytes({}));
    } catch (const StartFailed&) {  // node 0's: it waits for every node to hear it
      link.barrier();
      throw;
    }
  }
  for (const Tensor& t : start_tensors(start)) link.tensor(t);
  link.barrier();
  return start;
}

void prepare_checkpoint_dir(const RunConfig& config, const RunOptions& options, const StartingPoint& start,
                            const std::string& cut_metrics, std::ostream& out) {
  const fs::path root = config.checkpoint.dir;
  if (!start.resumed) {
    if (!options.overwrite) return;  // a fresh start found no earlier run's checkpoints (checked)
    for (const fs::path& dir : retire_checkpoints_after(root, 0)) {
      out << "removed " << dir.string() << ": a checkpoint of the run --overwrite replaces\n";
    }
    return;
  }
  const std::int64_t step = start.state.step;
  if (checkpoints_after(root, step).empty()) return;
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  const std::string name = fmt::format("superseded-at-step-{:08d}-{}", step, now.count());
  fs::path aside = root / name;
  for (int n = 2; !fs::create_directory(aside); ++n) aside = root / fmt::format("{}-{}", name, n);  // a fresh one
  // The metrics lines first: a crash among the moves leaves them with what was moved.
  if (!cut_metrics.empty()) write_file_durably(aside / "metrics.jsonl", cut_metrics);
  const std::vector<fs::path> moved = set_aside_checkpoints_after(root, step, aside);
  out << "moved " << moved.size() << " later checkpoint(s), " << moved.front().filename().string() << " to "
      << moved.back().filename().string() << (cut_metrics.empty() ? "" : ", and their metrics lines")
      << ", to " << aside.string() << ": the timeline this run resumes away from (a bare --resume no longer picks "
      << "them; delete the folder when it is no longer needed)\n";
}

}  // namespace atl
