#include "graph/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

namespace atl {

const std::vector<std::string>& backends() {
  static const std::vector<std::string> names = {"sim", "ucx", "nccl"};
  return names;
}

const char* engine_name(Engine engine) { return engine == Engine::reference ? "reference" : "actors"; }

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::sim: return "sim";
    case Backend::ucx: return "ucx";
    case Backend::nccl: return "nccl";
  }
  return "?";
}

const std::vector<std::string>& model_families() {
  static const std::vector<std::string> families = {"beam", "flint", "inkling2"};
  return families;
}

namespace {

// Applies one `a.b.c=value` to the tree, creating mappings on the way.
void apply_set(YAML::Node& root, const std::string& assignment, const std::string& source) {
  const std::size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw ConfigError(source, "", fmt::format("--set '{}': expected key.path=value", assignment));
  }
  const std::string key = assignment.substr(0, equals);
  const std::string text = assignment.substr(equals + 1);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    std::size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (parts.back().empty()) {
      throw ConfigError(source, "", fmt::format("--set '{}': '{}' has an empty key component", assignment, key));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }

  YAML::Node value;
  if (text.empty()) {
    value = YAML::Node(std::string());
  } else {
    try {
      check_config_text(text, source);
      value = YAML::Load(text);
      // As a config file: one document, each key once (checked before the value joins the tree).
      check_single_document(text, source);
      check_no_duplicate_keys(value, source);
    } catch (const YAML::Exception& e) {
      throw ConfigError(source, key, fmt::format("--set value '{}' is not valid YAML: {}", text, e.msg));
    } catch (const ConfigError& e) {
      throw ConfigError(source, e.key().empty() ? key : key + "." + e.key(),
                        fmt::format("--set value '{}': {}", text, e.problem()));
    }
  }

  // reset() rebinds a handle; operator= on a Node would overwrite the node it refers to.
  YAML::Node current;
  current.reset(root);
  std::string walked;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (i ? "." : "") + parts[i];
    const YAML::Node& const_current = current;
    YAML::Node child = const_current[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      current[parts[i]] = YAML::Node(YAML::NodeType::Map);
    } else if (!child.IsMap()) {
      throw ConfigError(source, walked,
                        fmt::format("--set {}: expected a mapping to set '{}' in, got {}", assignment,
                                    parts[i + 1], ConfigReader::describe_value(child)));
    }
    YAML::Node next = current[parts[i]];
    current.reset(next);
  }
  current[parts.back()] = value;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

MeshConfig read_mesh(ConfigReader reader) {
  MeshConfig mesh;
  mesh.pp = reader.get_positive("pp", 1);
  mesh.dp_replicate = reader.get_positive("dp_replicate", 1);
  mesh.dp_shard = reader.get_positive("dp_shard", 1);
  mesh.cp = reader.get_positive("cp", 1);
  mesh.ep = reader.get_positive("ep", 1);
  reader.finish();
  return mesh;
}

nlohmann::json nodes_json(const std::vector<NodeEntry>& nodes) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& n : nodes) out.push_back({{"host", n.host}, {"port", n.port}, {"ranks", n.ranks}});
  return out;
}

}  // namespace

nlohmann::json multi_process_settings(const TopologyConfig& t) {
  return {{"nodes", nodes_json(t.nodes)},
          {"ucx_peer_errors", t.ucx_peer_errors},
          {"job_token_file", t.job_token_file},
          {"rendezvous_timeout_s", t.rendezvous_timeout_s},
          {"heartbeat_timeout_s", t.heartbeat_timeout_s}};
}

namespace {

TopologyConfig read_topology(ConfigReader reader) {
  TopologyConfig topology;
  const std::string backend = reader.get_choice("backend", "sim", backends());
  topology.backend = backend == "ucx" ? Backend::ucx : backend == "nccl" ? Backend::nccl : Backend::sim;
  topology.engine = reader.get_choice("engine", "actors", {"actors", "reference"}) == "reference" ? Engine::reference
                                                                                                 : Engine::actors;
  topology.mesh = read_mesh(reader.section("mesh"));
  topology.ep_dispatch = reader.get_choice("ep_dispatch", "all_to_all", {"all_to_all", "all_gather"}) == "all_gather"
                             ? ExpertDispatchFlow::all_gather
                             : ExpertDispatchFlow::all_to_all;
  topology.ucx_peer_errors = reader.get<bool>("ucx_peer_errors", true);
  topology.job_token_file = reader.get<std::string>("job_token_file", "");
  topology.rendezvous_timeout_s = reader.get<double>("rendezvous_timeout_s", topology.rendezvous_timeout_s);
  reader.check(topology.rendezvous_timeout_s >= 0.1 && topology.rendezvous_timeout_s <= 86400, "rendezvous_timeout_s",
               "seconds in [0.1, 86400]");
  topology.heartbeat_timeout_s = reader.get<double>("heartbeat_timeout_s", topology.heartbeat_timeout_s);
  reader.check(topology.heartbeat_timeout_s >= 1 && topology.heartbeat_timeout_s <= 3600, "heartbeat_timeout_s",
               "seconds in [1, 3600] (heartbeats go every 0.5 s)");
  if (YAML::Node list = reader.node("nodes"); list && !list.IsNull()) {
    reader.check(list.IsSequence(), "nodes", "a list of {host, port, ranks} (empty: none)");
    for (std::size_t i = 0; i < list.size(); ++i) {
      ConfigReader n(list[i], reader.file(), reader.path("nodes") + "[" + std::to_string(i) + "]");
      NodeEntry e;
      e.host = n.require<std::string>("host");
      n.check(!e.host.empty(), "host", "a host name or address");
      e.port = n.get<std::int64_t>("port", 29500);
      n.check(e.port >= 1 && e.port <= 65535, "port", "a port in 1..65535");
      e.ranks = n.require<std::int64_t>("ranks");
      n.check(e.ranks >= 1, "ranks", "a positive integer");
      n.finish();
      topology.nodes.push_back(e);
    }
  }
  // The settings of multi-process jobs: a sim run (one process) would ignore them silently. (At
  // their defaults they pass: a resolved config, which lists every key, parses back.)
  if (topology.backend == Backend::sim) {
    const nlohmann::json given = multi_process_settings(topology), defaults = multi_process_settings({});
    for (const auto& [key, value] : given.items()) {
      if (value != defaults.at(key)) {
        reader.fail(key, "a setting of multi-process jobs (topology.backend: ucx); topology.backend is sim");
      }
    }
  }
  if (reader.has("sim_delay_ms")) {
    ConfigReader delays = reader.section("sim_delay_ms");
    for (const char* kind :
         {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all_v", "send", "recv"}) {
      if (auto ms = delays.optional<double>(kind)) {
        delays.check(*ms >= 0, kind, "a non-negative number of milliseconds");
        topology.sim_delay_ms[kind] = *ms;
      }
    }
    delays.finish();
    // Only the sim backend injects delays: a ucx run would ignore them silently. (None, `{}`, is
    // what a resolved config of any backend lists.)
    if (topology.backend != Backend::sim && !topology.sim_delay_ms.empty()) {
      reader.fail("sim_delay_ms", "the sim backend's injected delays; topology.backend is " + backend);
    }
  }
  reader.finish();
  return topology;
}

TrainConfig read_train(ConfigReader reader) {
  TrainConfig train;
  auto positive = [&](const char* key) {
    std::int64_t v = reader.require<std::int64_t>(key);
    reader.check(v >= 1, key, "a positive integer");
    return v;
  };
  auto number_in = [&](const char* key, double fallback, bool ok(double), const char* expected) {
    double v = reader.get<double>(key, fallback);
    reader.check(ok(v), key, expected);
    return v;
  };
  train.steps = positive("steps");
  train.global_batch = positive("global_batch");
  train.micro_batch = positive("micro_batch");
  if (train.global_batch % train.micro_batch != 0) {
    reader.fail("global_batch",
                fmt::format("expected a multiple of train.micro_batch ({}), got {}", train.micro_batch, train.global_batch));
  }
  train.seq_len = reader.require<std::int64_t>("seq_len");
  reader.check(train.seq_len >= 2, "seq_len", "an integer >= 2");
  // Steps hold global_batch x seq_len tokens at once (a product that must not overflow anything
  // downstream either).
  std::int64_t step_tokens = 0;
  if (__builtin_mul_overflow(train.global_batch, train.seq_len, &step_tokens) || step_tokens > kMaxStepTokens) {
    reader.fail(train.seq_len > kMaxStepTokens ? "seq_len" : "global_batch",
                fmt::format("global_batch x seq_len = {} x {} tokens per step; expected at most {}",
                            train.global_batch, train.seq_len, kMaxStepTokens));
  }
  // The optimizer runs in fp32: a number it cannot hold is 0 or inf there.
  const auto fp32_positive = [](double v) { return v >= 1.1754943508222875e-38 && v <= 3.4028234663852886e38; };
  train.lr = reader.require<double>("lr");
  reader.check(fp32_positive(train.lr), "lr", "a positive number that fp32 represents (1.2e-38 .. 3.4e38)");
  train.warmup = reader.get_non_negative("warmup", 0);
  train.seed = reader.get<std::uint64_t>("seed", 0);
  train.min_lr_ratio = number_in("min_lr_ratio", 0.1, [](double v) { return v >= 0 && v <= 1; }, "a number in [0, 1]");
  train.weight_decay = number_in("weight_decay", 0.1, [](double v) { return v >= 0 && v <= 3.4028234663852886e38; },
                                 "a non-negative number that fp32 represents (<= 3.4e38)");
  train.beta1 = number_in("beta1", 0.9, [](double v) { return v >= 0 && v < 1; }, "a number in [0, 1)");
  train.beta2 = number_in("beta2", 0.95, [](double v) { return v >= 0 && v < 1; }, "a number in [0, 1)");
  // AdamW runs in fp32: an eps below fp32's smallest normal number (1.2e-38) is 0 or denormal there.
  train.adam_eps = number_in("adam_eps", 1e-8, [](double v) { return v >= 1.1754943508222875e-38; },
                             "a positive number that fp32 represents (>= 1.2e-38)");
  train.grad_clip = number_in("grad_clip", 1.0, [](double v) { return v >= 0; }, "a non-negative number (0 = off)");
  train.log_every = reader.get_positive("log_every", 10);
  train.skip_nonfinite_steps = reader.get_choice("on_nonfinite", "stop", {"stop", "skip_step"}) == "skip_step";
  train.max_skipped_steps = reader.get_non_negative("max_skipped_steps", 10);
  train.schedule = reader.get_choice("schedule", "one_at_a_time", {"one_at_a_time", "all_forward_first"}) ==
                           "all_forward_first"
                       ? StepSchedule::all_forward_first
                       : StepSchedule::one_at_a_time;
  reader.finish();
  return train;
}

DataConfig read_data(ConfigReader reader) {
  DataConfig data;
  // `source: text:` with nothing after the colon reads as a YAML mapping {text: null}.
  if (const YAML::Node given = reader.node("source"); given.IsMap() && given.size() == 1) {
    const std::string kind = given.begin()->first.as<std::string>();
    if ((kind == "text" || kind == "tokens") && given.begin()->second.IsNull()) {
      reader.fail("source", "'" + kind + ":' names no file; expected '" + kind + ":<path>'");
    }
  }
  std::string source = reader.get<std::string>("source", "synthetic");
  std::optional<DataSourceSpec> spec = parse_data_source_spec(source);
  reader.check(spec.has_value(), "source", "'synthetic', 'text:<path>' or 'tokens:<path>'");
  data.kind = spec->kind;
  data.path = spec->path;
  data.synthetic_branching = reader.get_positive("synthetic_branching", data.synthetic_branching);
  data.synthetic_min_doc = reader.get_positive("synthetic_min_doc", data.synthetic_min_doc);
  data.synthetic_max_doc = reader.get_positive("synthetic_max_doc", data.synthetic_max_doc);
  reader.check(data.synthetic_max_doc >= data.synthetic_min_doc, "synthetic_max_doc",
               fmt::format("an integer >= data.synthetic_min_doc ({})", data.synthetic_min_doc));
  // Every target predicts the next token of its own document: one-token documents only hold none.
  reader.check(data.synthetic_max_doc >= 2, "synthetic_max_doc",
               "an integer >= 2 (one-token documents hold no target: nothing to train on)");
  // A document is generated whole (8 bytes a token), and token t of document d draws counter
  // d * max_doc + t: the bound keeps both sane (2^40 documents before the counter wraps).
  reader.check(data.synthetic_max_doc <= kMaxSyntheticDoc, "synthetic_max_doc",
               fmt::format("an integer <= {} (2^24 tokens)", kMaxSyntheticDoc));
  if (auto eos = reader.optional<std::int64_t>("eos_id")) {
    reader.check(*eos >= 0, "eos_id", "a non-negative token id");
    data.eos_id = *eos;
  }
  data.token_width = reader.get<std::int64_t>("token_width", 0);
  reader.check(data.token_width == 0 || data.token_width == 2 || data.token_width == 4, "token_width",
               "2 or 4 (bytes per token), or 0 for the file extension");
  data.loop = reader.get<bool>("loop", true);
  // A key set for a source it does not apply to is a mistake (it would be ignored). A resolved
  // config (to_json) lists every key at its default, so defaults pass.
  const DataConfig defaults;
  const std::string source_name = source.substr(0, source.find(':'));
  auto applies_only_to = [&](const char* key, bool applies, bool is_default, const char* where) {
    if (!applies && !is_default) {
      reader.fail(key, fmt::format("applies to {} only; data.source is {}", where, source_name));
    }
  };
  const bool synthetic = data.kind == DataSourceKind::synthetic, tokens = data.kind == DataSourceKind::tokens;
  applies_only_to("synthetic_branching", synthetic, data.synthetic_branching == defaults.synthetic_branching,
                  "data.source: synthetic");
  applies_only_to("synthetic_min_doc", synthetic, data.synthetic_min_doc == defaults.synthetic_min_doc,
                  "data.source: synthetic");
  applies_only_to("synthetic_max_doc", synthetic, data.synthetic_max_doc == defaults.synthetic_max_doc,
                  "data.source: synthetic");
  applies_only_to("eos_id", tokens, !data.eos_id.has_value(), "data.source: tokens:<path>");
  applies_only_to("token_width", tokens, data.token_width == defaults.token_width, "data.source: tokens:<path>");
  applies_only_to("loop", !synthetic, data.loop == defaults.loop, "file sources (text:<path>, tokens:<path>)");
  reader.finish();
  return data;
}

ModelSection read_model(ConfigReader reader) {
  ModelSection model;
  model.family = reader.require<std::string>("family");
  reader.check(std::find(model_families().begin(), model_families().end(), model.family) != model_families().end(),
               "family", "one of " + join(model_families()));
  model.preset = reader.get<std::string>("preset", "");
  // Everything else belongs to the family, which checks it with its own ConfigReader(overrides, file, "model").
  model.overrides = YAML::Node(YAML::NodeType::Map);
  for (const std::string& key : reader.keys()) {
    if (key == "family" || key == "preset") continue;
    model.overrides[key] = YAML::Clone(reader.node(key));
  }
  return model;
}

}  // namespace

namespace {

// The last --set assignment that gave `key` (the key itself, or a mapping holding it), if any.
const std::string* set_giving(const std::string& key, const std::vector<std::string>& sets) {
  const std::string* found = nullptr;
  for (const std::string& assignment : sets) {
    const std::string set_key = assignment.substr(0, assignment.find('='));
    const bool inside = key.rfind(set_key + ".", 0) == 0 || key.rfind(set_key + "[", 0) == 0;
    if (!key.empty() && (key == set_key || inside)) found = &assignment;
  }
  return found;
}

RunConfig read_run_config(const YAML::Node& root, const std::string& source_name) {
  RunConfig config;
  config.source_file = source_name;
  ConfigReader top(root, source_name);
  config.run_dir = top.get<std::string>("run_dir", "runs/" + std::filesystem::path(source_name).stem().string());
  top.check(!config.run_dir.empty(), "run_dir", "a directory path");
  config.model = read_model(top.section("model"));
  config.topology = read_topology(top.section("topology"));
  config.precision = parse_precision(top.get_choice("precision", "bf16", {"bf16", "fp32"}));
  config.train = read_train(top.section("train"));
  config.data = read_data(top.section("data"));
  {
    ConfigReader ck = top.section("checkpoint");
    config.checkpoint.dir = ck.get<std::string>("dir", default_checkpoint_dir(config.run_dir));
    ck.check(!config.checkpoint.dir.empty(), "dir", "a directory path");
    config.checkpoint.every = ck.get_non_negative("every", 0);
    config.checkpoint.keep = ck.get_non_negative("keep", 3);
    config.checkpoint.load = ck.get<std::string>("load", "");
    ck.finish();
  }
  {
    ConfigReader compute = top.section("compute");
    config.compute.threads = compute.get_non_negative("threads", 0);
    compute.check(config.compute.threads <= 4096, "threads", "a thread count of at most 4096 (0 = automatic)");
    config.compute.bf16_amx = compute.get_choice("bf16_gemm", "chain", {"chain", "amx"}) == "amx";
    compute.finish();
  }
  // A resolved config (run.json's "config", trainer_state.json) names the file it was read from;
  // read back as a config, that is history: errors name the file being read.
  (void)top.get<std::string>("source_file", "");
  top.finish();
  return config;
}

}  // namespace

RunConfig parse_run_config(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& sets) {
  check_config_text(yaml_text, source_name);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);  // (not LoadAll: yaml-cpp 0.7's loops forever on input such as ",mm")
  } catch (const YAML::ParserException& e) {
    throw ConfigError(source_name, "",
                      fmt::format("line {}, column {}: YAML syntax error: {}", e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  check_single_document(yaml_text, source_name);
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  try {
    check_no_duplicate_keys(root, source_name);
  } catch (const ConfigError& e) {
    throw FileTextError(e.file(), e.key(), e.problem());
  }
  if (!root.IsMap()) {
    throw ConfigError(source_name, "",
                      "expected a mapping of keys at the top level, got " + ConfigReader::describe_value(root));
  }
  for (const std::string& assignment : sets) apply_set(root, assignment, source_name);
  try {
    return read_run_config(root, source_name);
  } catch (const ConfigError& e) {
    rethrow_naming_set(e, sets);
  }
}

namespace {

// e's problem ending "(given by --set key=value)", when a --set gave its key and it does not say so yet.
std::optional<std::string> problem_naming_set(const ConfigError& e, const std::vector<std::string>& sets) {
  if (dynamic_cast<const FileTextError*>(&e)) return std::nullopt;  // the file's text, before any --set
  const std::string* given = set_giving(e.key(), sets);
  const std::string what = e.what();
  if (!given || what.find(" (given by --set ") != std::string::npos) return std::nullopt;
  const std::size_t prefix = e.file().size() + 2 + (e.key().empty() ? 0 : e.key().size() + 2);
  // The empty string, not "absent": that is key=null (key=~ too, but the shell turns an unquoted
  // run_dir=~ into the home directory).
  const bool empty = given->back() == '=';
  return what.substr(prefix) + " (given by --set " + *given +
         (empty ? "; '" + *given + "null' leaves the key unset" : "") + ")";
}

}  // namespace

void rethrow_naming_set(const ConfigError& e, const std::vector<std::string>& sets) {
  const std::optional<std::string> problem = problem_naming_set(e, sets);
  if (!problem) throw;  // the error as caught
  if (dynamic_cast<const UnknownKeyError*>(&e)) throw UnknownKeyError(e.file(), e.key(), *problem);  // keep the kind
  throw ConfigError(e.file(), e.key(), *problem);
}

std::string message_naming_set(const ConfigError& e, const std::vector<std::string>& sets) {
  const std::optional<std::string> problem = problem_naming_set(e, sets);
  return problem ? ConfigError(e.file(), e.key(), *problem).what() : e.what();
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(path, "", "is a directory; expected a YAML config file (e.g. configs/beam-tiny.yaml)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path, "", fmt::format("cannot open config file: {}", std::strerror(errno)));
  // Read up to the limit and one byte more: a device like /dev/zero must not fill the memory.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw ConfigError(path, "", "cannot read config file");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(path, "", fmt::format("more than {} MiB; expected a YAML config file (a few KiB)",
                                            kMaxConfigBytes >> 20));
  }
  return parse_run_config(text, path, sets);
}


nlohmann::json saved_config_as_read(nlohmann::json saved) {
  if (!saved.is_object() || !saved.contains("model") || !saved.at("model").is_object()) return saved;
  for (auto& [key, value] : saved.at("model").items()) {
    if (key == "family" || key == "preset" || !value.is_string()) continue;
    if (auto boolean = parse_config_bool(value.get<std::string>())) value = *boolean;
  }
  return saved;
}

nlohmann::json to_json(const RunConfig& c) {
  nlohmann::json model = yaml_to_json(c.model.overrides);
  if (!model.is_object()) model = nlohmann::json::object();
  model["family"] = c.model.family;
  model["preset"] = c.model.preset;
  const MeshConfig& m = c.topology.mesh;
  const TrainConfig& t = c.train;
  const DataConfig& d = c.data;
  nlohmann::json out = {
      {"source_file", c.source_file},
      {"run_dir", c.run_dir},
      {"model", model},
      {"topology",
       {{"backend", backend_name(c.topology.backend)},
        {"engine", engine_name(c.topology.engine)},
        {"sim_delay_ms", c.topology.sim_delay_ms},
        {"ep_dispatch", expert_dispatch_flow_name(c.topology.ep_dispatch)},
        {"mesh", {{"pp", m.pp}, {"dp_replicate", m.dp_replicate}, {"dp_shard", m.dp_shard}, {"cp", m.cp}, {"ep", m.ep}}}}},
      {"precision", precision_name(c.precision)},
      {"train",
       {{"steps", t.steps},
        {"global_batch", t.global_batch},
        {"micro_batch", t.micro_batch},
        {"seq_len", t.seq_len},
        {"lr", t.lr},
        {"warmup", t.warmup},
        {"seed", t.seed},
        {"min_lr_ratio", t.min_lr_ratio},
        {"weight_decay", t.weight_decay},
        {"beta1", t.beta1},
        {"beta2", t.beta2},
        {"adam_eps", t.adam_eps},
        {"grad_clip", t.grad_clip},
        {"log_every", t.log_every},
        {"on_nonfinite", t.skip_nonfinite_steps ? "skip_step" : "stop"},
        {"max_skipped_steps", t.max_skipped_steps},
        {"schedule", step_schedule_name(t.schedule)}}},
      {"data",
       {{"source", data_source_spec(d)},
        {"synthetic_branching", d.synthetic_branching},
        {"synthetic_min_doc", d.synthetic_min_doc},
        {"synthetic_max_doc", d.synthetic_max_doc},
        {"eos_id", d.eos_id ? nlohmann::json(*d.eos_id) : nlohmann::json(nullptr)},
        {"token_width", d.token_width},
        {"loop", d.loop}}},
      {"checkpoint",
       {{"dir", c.checkpoint.dir},
        {"every", c.checkpoint.every},
        {"keep", c.checkpoint.keep},
        {"load", c.checkpoint.load}}},
      {"compute", {{"threads", c.compute.threads}, {"bf16_gemm", c.compute.bf16_amx ? "amx" : "chain"}}},
  };
  out["topology"].update(multi_process_settings(c.topology));
  return out;
}

std::string default_checkpoint_dir(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoints").string();
}

}  // namespace atl
