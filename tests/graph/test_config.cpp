// The YAML run config: defaults, --set overrides, and errors that name the file and the dotted key.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/models/model.hpp"
#include "graph/config.hpp"

using namespace atl;
namespace fs = std::filesystem;

namespace {

struct ConfigDir {
  fs::path path;
  ConfigDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("atoll_test_config_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~ConfigDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::string file = (path / name).string();
    std::ofstream(file) << text;
    return file;
  }
};

const char* kMinimal = R"(run_dir: runs/test
model:
  family: beam
  preset: beam-tiny-moe
train:
  steps: 100
  global_batch: 8
  micro_batch: 2
  seq_len: 32
  lr: 3.0e-3
)";

std::string config_error(const std::string& path, const std::vector<std::string>& sets = {}) {
  try {
    load_run_config(path, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// kMinimal with `from` replaced by `to` (the text must contain `from`).
std::string edited(const std::string& from, const std::string& to) {
  std::string text = kMinimal;
  std::size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("config: a minimal file loads with every default filled in", "[config]") {
  ConfigDir dir;
  std::string file = dir.write("minimal.yaml", kMinimal);
  RunConfig c = load_run_config(file, {});
  CHECK(c.source_file == file);
  CHECK(c.run_dir == "runs/test");
  CHECK(c.model.family == "beam");
  CHECK(c.model.preset == "beam-tiny-moe");
  CHECK(c.model.overrides.IsMap());
  CHECK(c.model.overrides.size() == 0);
  CHECK(c.topology.backend == Backend::sim);
  CHECK(c.topology.mesh.pp == 1);
  CHECK(c.topology.mesh.dp_replicate == 1);
  CHECK(c.topology.mesh.dp_shard == 1);
  CHECK(c.topology.mesh.cp == 1);
  CHECK(c.topology.mesh.ep == 1);
  CHECK(c.topology.mesh.world_size() == 1);
  CHECK(c.precision == Precision::bf16);
  CHECK(c.train.steps == 100);
  CHECK(c.train.global_batch == 8);
  CHECK(c.train.micro_batch == 2);
  CHECK(c.train.seq_len == 32);
  CHECK(c.train.lr == 3.0e-3);
  CHECK(c.train.warmup == 0);
  CHECK(c.train.seed == 0);
  CHECK(c.train.min_lr_ratio == 0.1);
  CHECK(c.train.weight_decay == 0.1);
  CHECK(c.train.beta1 == 0.9);
  CHECK(c.train.beta2 == 0.95);
  CHECK(c.train.adam_eps == 1e-8);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.train.log_every == 10);
  CHECK(c.data.kind == DataSourceKind::synthetic);
  CHECK(c.data.synthetic_branching == 4);
  CHECK(c.data.synthetic_min_doc == 8);
  CHECK(c.data.synthetic_max_doc == 64);
  CHECK_FALSE(c.data.eos_id.has_value());
  CHECK(c.data.token_width == 0);
  CHECK(c.data.loop);

  nlohmann::json j = to_json(c);
  CHECK(j["train"]["beta2"] == 0.95);
  CHECK(j["train"]["steps"] == 100);
  CHECK(j["topology"]["mesh"]["dp_shard"] == 1);
  CHECK(j["topology"]["backend"] == "sim");
  CHECK(j["precision"] == "bf16");
  CHECK(j["data"]["source"] == "synthetic");
  CHECK(j["data"]["eos_id"].is_null());
  CHECK(j["model"]["family"] == "beam");

  // run_dir defaults to runs/<file stem>.
  std::string no_run_dir = dir.write("stemmed.yaml", edited("run_dir: runs/test\n", ""));
  CHECK(load_run_config(no_run_dir, {}).run_dir == "runs/stemmed");
}

TEST_CASE("config: every section read from the file, model overrides kept for the family", "[config]") {
  ConfigDir dir;
  // Model overrides: any key of `model:` other than family and preset.
  std::string text = edited("train:", "  hidden_size: 32\n  layer_types: [sliding_attention, full_attention]\ntrain:");
  std::string file = dir.write("full.yaml", text + R"(  warmup: 5
  seed: 1234
  min_lr_ratio: 0.05
  weight_decay: 0.0
  beta1: 0.8
  beta2: 0.99
  adam_eps: 1.0e-6
  grad_clip: 0
  log_every: 1
topology:
  backend: ucx
  mesh: {pp: 2, dp_replicate: 1, dp_shard: 2, cp: 2, ep: 4}
precision: fp32
data:
  source: tokens:data/shard.bin
  eos_id: 0
  token_width: 4
  loop: false
)");
  RunConfig c = load_run_config(file, {});
  CHECK(c.train.warmup == 5);
  CHECK(c.train.seed == 1234u);
  CHECK(c.train.min_lr_ratio == 0.05);
  CHECK(c.train.weight_decay == 0.0);
  CHECK(c.train.beta1 == 0.8);
  CHECK(c.train.beta2 == 0.99);
  CHECK(c.train.adam_eps == 1.0e-6);
  CHECK(c.train.grad_clip == 0.0);
  CHECK(c.train.log_every == 1);
  CHECK(c.topology.backend == Backend::ucx);
  CHECK(c.topology.mesh.pp == 2);
  CHECK(c.topology.mesh.cp == 2);
  CHECK(c.topology.mesh.ep == 4);
  CHECK(c.topology.mesh.world_size() == 8);
  CHECK(c.precision == Precision::fp32);
  CHECK(c.data.kind == DataSourceKind::tokens);
  CHECK(c.data.path == "data/shard.bin");
  CHECK(c.data.eos_id == std::optional<std::int64_t>(0));
  CHECK(c.data.token_width == 4);
  CHECK_FALSE(c.data.loop);

  REQUIRE(c.model.overrides.size() == 2);
  ConfigReader model(c.model.overrides, c.source_file, "model");
  CHECK(model.get<std::int64_t>("hidden_size", 64) == 32);
  CHECK(model.get<std::vector<std::string>>("layer_types", {}) ==
        std::vector<std::string>{"sliding_attention", "full_attention"});
  CHECK_NOTHROW(model.finish());
  // A float key's value must survive fp32: 1e39 became inf (a JSON null in the run's checkpoint),
  // 1e-50 a zero.
  YAML::Node floats = YAML::Load("{big: 1.0e39, tiny: 1.0e-50, fine: 1.0e38, zero: 0.0, small: 1.0e-44}");
  ConfigReader float_keys(floats, c.source_file, "model");
  CHECK_THROWS_WITH(float_keys.get<float>("big", 1.0f),
                    Catch::Contains("model.big: expected a number that fp32 represents (|x| <= 3.4e38") &&
                        Catch::Contains("got 1.0e39"));
  CHECK_THROWS_WITH(float_keys.get<float>("tiny", 1.0f), Catch::Contains("model.tiny: expected a number that fp32"));
  CHECK(float_keys.get<float>("fine", 1.0f) == 1.0e38f);
  CHECK(float_keys.get<float>("zero", 1.0f) == 0.0f);
  CHECK(float_keys.get<float>("small", 1.0f) > 0.0f);  // a denormal, but not zero
  CHECK(float_keys.get<double>("big", 1.0) == 1.0e39);  // a double key holds it

  nlohmann::json j = to_json(c);
  CHECK(j["model"]["hidden_size"] == 32);
  CHECK(j["model"]["layer_types"][1] == "full_attention");
  CHECK(j["data"]["source"] == "tokens:data/shard.bin");
  CHECK(j["data"]["eos_id"] == 0);
}

TEST_CASE("config: --set overrides values, creates sections, and is validated like the file", "[config]") {
  ConfigDir dir;
  std::string file = dir.write("base.yaml", kMinimal);
  RunConfig c = load_run_config(file, {"train.steps=7", "topology.mesh.dp_shard=2", "topology.backend=nccl",
                                       "precision=fp32", "model.hidden_size=128", "data.source=text:corpus.txt",
                                       "train.lr=1e-3", "data.loop=false", "train.schedule=all_forward_first"});
  CHECK(c.train.steps == 7);
  CHECK(c.train.schedule == StepSchedule::all_forward_first);
  CHECK(load_run_config(file, {}).train.schedule == StepSchedule::one_at_a_time);  // the default
  CHECK(c.topology.mesh.dp_shard == 2);
  CHECK(c.topology.mesh.pp == 1);
  CHECK(c.topology.backend == Backend::nccl);
  CHECK(c.precision == Precision::fp32);
  CHECK(c.train.lr == 1e-3);
  CHECK(c.data.kind == DataSourceKind::text);
  CHECK(c.data.path == "corpus.txt");
  CHECK_FALSE(c.data.loop);
  CHECK(ConfigReader(c.model.overrides, file, "model").get<std::int64_t>("hidden_size", 0) == 128);
  // Values the file had and --set did not touch stay.
  CHECK(c.train.global_batch == 8);
  CHECK(c.model.preset == "beam-tiny-moe");

  CHECK_THAT(config_error(file, {"train.stepz=3"}),
             Catch::Contains(file) && Catch::Contains("train.stepz: unknown key"));
  CHECK_THAT(config_error(file, {"topology.mesh.dp_shard=0"}),
             Catch::Contains(file + ": topology.mesh.dp_shard: expected a positive integer, got 0"));
  CHECK_THAT(config_error(file, {"train.steps"}), Catch::Contains(file) && Catch::Contains("key.path=value"));
  CHECK_THAT(config_error(file, {"train.lr.value=3"}), Catch::Contains(file) && Catch::Contains("train.lr"));
}

TEST_CASE("config: each kind of mistake throws ConfigError naming the file and the dotted key", "[config]") {
  ConfigDir dir;
  struct Case {
    std::string name, text, expected;
  };
  const std::vector<Case> cases = {
      {"unknown_key", edited("  steps: 100", "  stepz: 100\n  steps: 100"),
       "train.stepz: unknown key (expected one of: steps, global_batch, micro_batch, seq_len, lr, warmup, seed"},
      {"unknown_top", std::string(kMinimal) + "trian: {}\n", "trian: unknown key (expected one of: run_dir, model"},
      {"wrong_type", edited("lr: 3.0e-3", "lr: fast"), "train.lr: expected a number, got 'fast'"},
      {"dp_shard_zero", std::string(kMinimal) + "topology: {mesh: {dp_shard: 0}}\n",
       "topology.mesh.dp_shard: expected a positive integer, got 0"},
      {"mesh_unknown", std::string(kMinimal) + "topology: {mesh: {tp: 2}}\n",
       "topology.mesh.tp: unknown key (expected one of: pp, dp_replicate, dp_shard, cp, ep)"},
      {"bad_precision", std::string(kMinimal) + "precision: fp16\n",
       "precision: expected one of bf16, fp32, got 'fp16'"},
      {"bad_backend", std::string(kMinimal) + "topology: {backend: mpi}\n",
       "topology.backend: expected one of sim, ucx, nccl, got 'mpi'"},
      {"not_divisible", edited("global_batch: 8", "global_batch: 9"),
       "train.global_batch: expected a multiple of train.micro_batch (2), got 9"},
      {"missing_steps", edited("  steps: 100\n", ""), "train.steps: required key is missing"},
      {"seq_len_one", edited("seq_len: 32", "seq_len: 1"), "train.seq_len: expected an integer >= 2, got 1"},
      {"steps_float", edited("steps: 100", "steps: 1.5"), "train.steps: expected an integer, got 1.5"},
      {"negative_warmup", edited("lr: 3.0e-3", "lr: 3.0e-3\n  warmup: -1"),
       "train.warmup: expected a non-negative integer, got -1"},
      {"zero_lr", edited("lr: 3.0e-3", "lr: 0"),
       "train.lr: expected a positive number that fp32 represents (1.2e-38 .. 3.4e38), got 0"},
      {"tiny_lr", edited("lr: 3.0e-3", "lr: 1.0e-50"), "train.lr: expected a positive number that fp32 represents"},
      {"huge_lr", edited("lr: 3.0e-3", "lr: 1.0e39"), "train.lr: expected a positive number that fp32 represents"},
      {"huge_weight_decay", edited("lr: 3.0e-3", "lr: 3.0e-3\n  weight_decay: 1.0e39"),
       "train.weight_decay: expected a non-negative number that fp32 represents (<= 3.4e38)"},
      // Rows x tokens would wrap around int64 (a small buffer written as a huge one).
      {"tokens_overflow", edited("global_batch: 8", "global_batch: 4611686018427387904"),
       "train.global_batch: global_batch x seq_len = 4611686018427387904 x 32 tokens per step; expected at most "
       "2147483648"},
      {"bad_source", std::string(kMinimal) + "data: {source: wiki}\n",
       "data.source: expected 'synthetic', 'text:<path>' or 'tokens:<path>', got 'wiki'"},
      {"empty_path", std::string(kMinimal) + "data: {source: 'text:'}\n", "data.source: expected"},
      {"bad_width", std::string(kMinimal) + "data: {token_width: 3}\n", "data.token_width: expected 2 or 4"},
      {"bad_family", edited("family: beam", "family: llama"),
       "model.family: expected one of beam, flint, inkling2, got 'llama'"},
      {"missing_family", edited("  family: beam\n", ""), "model.family: required key is missing"},
      {"section_scalar", std::string(kMinimal) + "topology: 4\n", "topology: expected a mapping of keys, got 4"},
      {"bad_bool", std::string(kMinimal) + "data: {loop: maybe}\n", "data.loop: expected true or false, got 'maybe'"},
      {"bad_schedule", edited("lr: 3.0e-3", "lr: 3.0e-3\n  schedule: 1f1b"), "train.schedule: expected one of"},
      {"negative_threads", std::string(kMinimal) + "compute: {threads: -2}\n",
       "compute.threads: expected a non-negative integer, got -2"},
      {"zero_rendezvous_timeout", std::string(kMinimal) + "topology: {rendezvous_timeout_s: 0}\n",
       "topology.rendezvous_timeout_s: expected seconds in [0.1, 86400], got 0"},
      {"short_heartbeat_timeout", std::string(kMinimal) + "topology: {heartbeat_timeout_s: 0.2}\n",
       "topology.heartbeat_timeout_s: expected seconds in [1, 3600] (heartbeats go every 0.5 s), got 0.2"},
      {"bad_bf16_gemm", std::string(kMinimal) + "compute: {bf16_gemm: fast}\n",
       "compute.bf16_gemm: expected one of chain, amx, got 'fast'"},
      {"huge_threads", std::string(kMinimal) + "compute: {threads: 100000}\n",
       "compute.threads: expected a thread count of at most 4096 (0 = automatic)"},
      {"delay_without_sim", std::string(kMinimal) + "topology: {backend: ucx, sim_delay_ms: {all_gather: 5}}\n",
       "topology.sim_delay_ms: the sim backend's injected delays; topology.backend is ucx"},
      {"nodes_with_sim", std::string(kMinimal) + "topology: {nodes: [{host: a, ranks: 1}]}\n",
       "topology.nodes: a setting of multi-process jobs (topology.backend: ucx); topology.backend is sim"},
      {"token_file_with_sim", std::string(kMinimal) + "topology: {job_token_file: /tmp/t}\n",
       "topology.job_token_file: a setting of multi-process jobs"},
      {"one_token_documents", std::string(kMinimal) + "data: {synthetic_min_doc: 1, synthetic_max_doc: 1}\n",
       "data.synthetic_max_doc: expected an integer >= 2 (one-token documents hold no target"},
      {"huge_documents", std::string(kMinimal) + "data: {synthetic_min_doc: 8, synthetic_max_doc: 1000000000000}\n",
       "data.synthetic_max_doc: expected an integer <= 16777216 (2^24 tokens)"},
      {"peer_errors_with_sim", std::string(kMinimal) + "topology: {ucx_peer_errors: false}\n",
       "topology.ucx_peer_errors: a setting of multi-process jobs"},
      // Quoted, a scalar is a string (as YAML and run.json read it), not the number it spells.
      {"quoted_integer", std::string(kMinimal) + "topology: {mesh: {dp_shard: \"2\"}}\n",
       "topology.mesh.dp_shard: expected an integer, got '2'"},
      {"quoted_number", edited("lr: 3.0e-3", "lr: '3.0e-3'"), "train.lr: expected a number, got '3.0e-3'"},
      {"quoted_bool", std::string(kMinimal) + "data: {loop: \"true\"}\n", "data.loop: expected true or false, got 'true'"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::string file = dir.write(c.name + ".yaml", c.text);
    CHECK_THAT(config_error(file), Catch::Contains(file + ": " + c.expected));
  }
}

TEST_CASE("config: missing files and YAML syntax errors name the file (and the line)", "[config]") {
  ConfigDir dir;
  std::string missing = (dir.path / "nope.yaml").string();
  CHECK_THAT(config_error(missing), Catch::Contains(missing) && Catch::Contains("cannot open"));
  std::string broken = dir.write("broken.yaml", "run_dir: x\nmodel:\n  family: [beam\ntrain: {}\n");
  std::string message = config_error(broken);
  CHECK_THAT(message, Catch::Contains(broken) && Catch::Contains("YAML syntax error") && Catch::Contains("line "));
  std::string two = dir.write("two.yaml", std::string(kMinimal) + "---\ntrain: {steps: 5}\n");
  CHECK_THAT(config_error(two), Catch::Contains(two + ": line 12: a second YAML document (after '---' or '...')"));
  std::string ended = dir.write("ended.yaml", std::string(kMinimal) + "...\ntrain: {steps: 5}\n");
  CHECK_THAT(config_error(ended), Catch::Contains("line 12: a second YAML document"));
  std::string inline_second = dir.write("inline.yaml", std::string(kMinimal) + "--- {train: {steps: 5}}\n");
  CHECK_THAT(config_error(inline_second), Catch::Contains("line 11: a second YAML document"));
  // A marker before the content, comments after the end, and '---' inside a value are one document.
  CHECK_NOTHROW(load_run_config(dir.write("leading.yaml", "%YAML 1.2\n--- # config\n" + std::string(kMinimal))));
  CHECK_NOTHROW(load_run_config(dir.write("comments.yaml", std::string(kMinimal) + "...\n# the end\n---\n")));
  CHECK_NOTHROW(load_run_config(dir.write("dashes.yaml", std::string(kMinimal) + "data: {source: 'text:a---b'}\n")));
  CHECK_NOTHROW(load_run_config(dir.write("trailing.yaml", std::string(kMinimal) + "---\n")));
  std::string list = dir.write("list.yaml", "- a\n- b\n");
  CHECK_THAT(config_error(list), Catch::Contains(list) && Catch::Contains("top level"));
}

TEST_CASE("ConfigReader: typed reads, list elements and unknown keys for family overrides", "[config]") {
  YAML::Node node = YAML::Load("{hidden: 64, layers: [0, 1, x], eps: 1e-6, on: yes, name: tiny, big: 1e3}");
  ConfigReader reader(node, "m.yaml", "model");
  CHECK(reader.get<std::int64_t>("hidden", 0) == 64);
  CHECK(reader.get<float>("eps", 0.0f) == 1e-6f);
  CHECK(reader.get<bool>("on", false));
  CHECK(reader.get<std::string>("name", "") == "tiny");
  CHECK(reader.get<std::int64_t>("big", 0) == 1000);
  CHECK(reader.get<int>("absent", 7) == 7);
  CHECK_FALSE(reader.has("absent2"));
  auto message = [&](auto f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no ConfigError)");
  };
  CHECK(message([&] { reader.get<std::vector<std::int64_t>>("layers", {}); }) ==
        "m.yaml: model.layers[2]: expected an integer, got 'x'");
  CHECK(message([&] { reader.get<std::vector<std::int64_t>>("hidden", {}); }) ==
        "m.yaml: model.hidden: expected a list of integers, got 64");
  YAML::Node quoted = YAML::Load("{ids: [1, '2'], name: '64'}");
  ConfigReader quoted_reader(quoted, "q.yaml", "model");
  CHECK(message([&] { quoted_reader.get<std::vector<std::int64_t>>("ids", {}); }) ==
        "q.yaml: model.ids[1]: expected an integer, got '2'");
  CHECK(quoted_reader.get<std::string>("name", "") == "64");  // a quoted string stays one
  YAML::Node tagged = YAML::Load("{depth: !!str 2, loop: !!str yes}");
  ConfigReader tagged_reader(tagged, "t.yaml", "model");
  CHECK(message([&] { tagged_reader.get<std::int64_t>("depth", 0); }) == "t.yaml: model.depth: expected an integer, got '2'");
  CHECK(message([&] { tagged_reader.get<bool>("loop", false); }) == "t.yaml: model.loop: expected true or false, got 'yes'");
  CHECK(message([&] { reader.require<double>("missing"); }) ==
        "m.yaml: model.missing: required key is missing (expected a number)");
  CHECK(message([&] { reader.finish(); }) == "(no ConfigError)");
  ConfigReader strict(node, "m.yaml", "model");
  strict.get<std::int64_t>("hidden", 0);
  CHECK_THAT(message([&] { strict.finish(); }),
             Catch::StartsWith("m.yaml: model.layers: unknown key (expected one of: hidden)"));
}

TEST_CASE("config: the shipped example configs load", "[config]") {
  const char* root = std::getenv("ATOLL_SOURCE_DIR");
  const fs::path configs = (root ? fs::path(root) : fs::path(__FILE__).parent_path().parent_path().parent_path()) / "configs";
  int loaded = 0;
  for (const auto& entry : fs::directory_iterator(configs)) {
    if (entry.path().extension() != ".yaml") continue;
    INFO(entry.path().string());
    const RunConfig config = load_run_config(entry.path().string(), {});
    CHECK(make_model(config.model, config.source_file)->parameter_count() > 0);  // the model it names builds
    ++loaded;
  }
  CHECK(loaded >= 4);  // beam-tiny, beam-small, flint-tiny, inkling2-tiny
}

TEST_CASE("config: model sizes whose element counts would overflow are refused, naming the parameter", "[config]") {
  ConfigDir dir;
  const std::string file = dir.write("base.yaml", kMinimal);
  for (const std::string& family : model_families()) {
    for (const char* set : {"model.hidden_size=4611686018427387904", "model.vocab_size=68719476736"}) {
      INFO(family << " " << set);
      const RunConfig config = load_run_config(file, {"model.family=" + family, "model.preset=null", set});
      CHECK_THROWS_WITH(make_model(config.model, config.source_file),
                        Catch::StartsWith(file + ": model: sizes too large: ") &&
                            Catch::Contains("takes the model past 2^40 parameters"));
    }
  }
}

TEST_CASE("config: a few lines of nested YAML aliases, or a device for a file, are refused, not walked or read whole",
          "[config]") {
  ConfigDir dir;
  // Nine levels of ten aliases each: a billion values once expanded (minutes to walk).
  std::string bomb = std::string(kMinimal) + "x:\n  l0: &l0 [a, a, a, a, a, a, a, a, a, a]\n";
  for (int level = 1; level < 9; ++level) {
    const std::string below = "*l" + std::to_string(level - 1);
    bomb += "  l" + std::to_string(level) + ": &l" + std::to_string(level) + " [" + below;
    for (int i = 1; i < 10; ++i) bomb += ", " + below;
    bomb += "]\n";
  }
  const std::string file = dir.write("bomb.yaml", bomb);
  CHECK_THAT(config_error(file), Catch::StartsWith(file + ": x.l") &&
                                     Catch::Contains(": more than 100000 values once its YAML aliases are expanded"));
  CHECK(config_error("/dev/zero") == "/dev/zero: more than 16 MiB; expected a YAML config file (a few KiB)");
}

TEST_CASE("config: an error about a value a --set gave names that --set", "[config]") {
  ConfigDir dir;
  const std::string file = dir.write("base.yaml", kMinimal);
  auto error_of = [&](const std::vector<std::string>& sets) {
    try {
      load_run_config(file, sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of({"train.lr=-1"}) == file + ": train.lr: expected a positive number that fp32 represents (1.2e-38 .. "
                                           "3.4e38), got -1 (given by --set train.lr=-1)");
  // A --set value is read as a config file is: each key once, one document.
  CHECK(error_of({"train={steps: 3, steps: 1, global_batch: 8, micro_batch: 2, seq_len: 32, lr: 0.1}"}) ==
        file + ": train.steps: --set value '{steps: 3, steps: 1, global_batch: 8, micro_batch: 2, seq_len: 32, lr: "
               "0.1}': duplicated key (line 1); each key may appear once");
  CHECK_THAT(error_of({"train.steps=2\n---\nfoo"}),
             Catch::StartsWith(file + ": train.steps: --set value '2\n---\nfoo': line 3: a second YAML document"));
  CHECK(error_of({"train.warmup=3", "train.warmup="}) ==
        file + ": train.warmup: expected an integer, got '' (given by --set train.warmup=; 'train.warmup=null' leaves "
               "the key unset)");
  CHECK(error_of({"topology={mesh: {dp_shard: 0}}"}) ==
        file + ": topology.mesh.dp_shard: expected a positive integer, got 0 (given by --set topology={mesh: {dp_shard: "
               "0}})");
  CHECK(error_of({"train.warmup=null"}) == "no error");
  CHECK(error_of({"train.warmup=~"}) == "no error");
  // A fault of the file's own text is not the --set's, even when the --set names the same key.
  const std::string twice = dir.write("twice.yaml", std::string(kMinimal) + "precision: bf16\nprecision: fp32\n");
  try {
    load_run_config(twice, {"precision=fp32"});
    FAIL("a duplicated key was accepted");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Catch::StartsWith(twice + ": precision: duplicated key (line ") &&
                                          Catch::EndsWith("); each key may appear once"));
    CHECK(message_naming_set(e, {"precision=fp32"}) == e.what());
  }
  // 'key: value' with a space is YAML's mapping: the message shows it and says how to write a string.
  CHECK(error_of({"data.source=text: corpus.txt"}) ==
        file + ": data.source: expected a string, got a mapping {'text': 'corpus.txt'} (YAML reads 'a: b' as a "
               "mapping: drop the space after the colon, or quote the value) (given by --set data.source=text: "
               "corpus.txt)");
  // An unknown key stays an UnknownKeyError (HF import relies on the kind).
  CHECK_THROWS_AS(load_run_config(file, {"train.stepz=3"}), UnknownKeyError);
  CHECK_THAT(error_of({"train.stepz=3"}), Catch::Contains("unknown key") && Catch::EndsWith("(given by --set train.stepz=3)"));
  // A value from the file is the file's: no --set named.
  const std::string bad = dir.write("bad.yaml", std::string(kMinimal) + "compute: {threads: -2}\n");
  try {
    load_run_config(bad, {"train.lr=1.0e-3"});
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), !Catch::Contains("given by"));
  }
}

TEST_CASE("yaml_to_json: scalars as the config reader reads them, quoted or !!str ones as strings", "[config]") {
  const nlohmann::json j = yaml_to_json(YAML::Load(
      "{a: yes, b: Off, c: 'on', d: !!str no, e: 12, f: '12', g: 2.5e-1, h: ~, i: [true, NO, x], j: Yes please}"));
  const nlohmann::json expected = {{"a", true},  {"b", false}, {"c", "on"},   {"d", "no"},
                                   {"e", 12},    {"f", "12"},  {"g", 0.25},   {"h", nullptr},
                                   {"i", {true, false, "x"}},  {"j", "Yes please"}};
  CHECK(j == expected);
}

TEST_CASE("config: a saved config whose model overrides were written 'no' or 'on' (earlier builds) reads as booleans",
          "[config]") {
  const nlohmann::json saved = {{"model", {{"family", "beam"}, {"preset", "on"}, {"norm_topk_prob", "no"},
                                           {"norm_topk_prob_top1", "On"}, {"hidden_size", 64}}},
                                {"data", {{"source", "yes"}}}};
  const nlohmann::json read = saved_config_as_read(saved);
  CHECK(read.at("model").at("norm_topk_prob") == false);
  CHECK(read.at("model").at("norm_topk_prob_top1") == true);
  CHECK(read.at("model").at("preset") == "on");  // names stay names
  CHECK(read.at("model").at("hidden_size") == 64);
  CHECK(read.at("data") == saved.at("data"));  // only model overrides were written so
  CHECK(saved_config_as_read(nlohmann::json::array()) == nlohmann::json::array());
}

TEST_CASE("config: a resolved config parses back to itself, for every backend's settings", "[config]") {
  ConfigDir dir;
  const std::string beam = dir.write("base.yaml", kMinimal);
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"topology.sim_delay_ms={all_gather: 2}"},
      {"topology.backend=ucx", "topology.ucx_peer_errors=false", "topology.rendezvous_timeout_s=30",
       "topology.heartbeat_timeout_s=9", "topology.job_token_file=/tmp/token",
       "topology.nodes=[{host: 127.0.0.1, port: 29400, ranks: 1}]"},
      {"topology.engine=reference", "data.source=tokens:data/x.u16", "data.eos_id=0"},
      {"model.norm_topk_prob=no", "model.norm_topk_prob_top1=ON"},  // YAML's other words for booleans
  };
  // What each case set, as the resolved config must hold it (a field to_json dropped would be
  // missing from both sides of the round trip, which alone could not tell).
  using Pointer = nlohmann::json::json_pointer;
  const std::vector<std::vector<std::pair<std::string, nlohmann::json>>> expected = {
      {},
      {{"/topology/sim_delay_ms/all_gather", 2}},
      {{"/topology/backend", "ucx"},
       {"/topology/ucx_peer_errors", false},
       {"/topology/rendezvous_timeout_s", 30},
       {"/topology/heartbeat_timeout_s", 9},
       {"/topology/job_token_file", "/tmp/token"},
       {"/topology/nodes/0/host", "127.0.0.1"},
       {"/topology/nodes/0/port", 29400},
       {"/topology/nodes/0/ranks", 1}},
      {{"/topology/engine", "reference"}, {"/data/eos_id", 0}},
      {{"/model/norm_topk_prob", false}, {"/model/norm_topk_prob_top1", true}},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const auto& sets = cases[c];
    INFO(sets.size());
    nlohmann::json resolved = to_json(load_run_config(beam, sets));
    for (const auto& [pointer, value] : expected[c]) {
      INFO(pointer);
      REQUIRE(resolved.contains(Pointer(pointer)));
      CHECK(resolved.at(Pointer(pointer)) == value);
    }
    nlohmann::json again = to_json(parse_run_config(resolved.dump(), "run.json"));
    CHECK(again.at("source_file") == "run.json");  // the file read, not the one it names
    again["source_file"] = resolved.at("source_file");
    CHECK(again == resolved);
  }
}

TEST_CASE("config: every model key a family takes is in its config.json (what a resume compares and export keeps)",
          "[config]") {
  for (const char* family : {"beam", "flint", "inkling2"}) {
    INFO(family);
    // The family's reader names every key it takes when it meets one it does not.
    ModelSection probe;
    probe.family = family;
    probe.overrides = YAML::Load("{no_such_key: 1}");
    std::string known;
    try {
      make_model(probe, "probe.yaml");
    } catch (const UnknownKeyError& e) {
      const std::string what = e.what(), marker = "expected one of: ";
      known = what.substr(what.find(marker) + marker.size());
      known = known.substr(0, known.rfind(')'));
    }
    REQUIRE_FALSE(known.empty());
    ModelSection plain;
    plain.family = family;
    plain.overrides = YAML::Node(YAML::NodeType::Map);
    const nlohmann::json hf = make_model(plain, "plain.yaml")->hf_config();
    std::size_t start = 0;
    for (std::size_t comma; start < known.size(); start = comma + 2) {
      comma = known.find(", ", start);
      if (comma == std::string::npos) comma = known.size();
      const std::string key = known.substr(start, comma - start);
      if (key == "family" || key == "preset") continue;
      INFO(key);
      CHECK(hf.contains(key == "init_std" ? std::string("initializer_range") : key));
    }
  }
}

TEST_CASE("config: a model setting that does not fit the others names both values", "[config]") {
  // (Set alone, the message names the key set and what it had to fit: the other key kept its value.)
  auto error_of = [](const std::string& family, const std::string& overrides) {
    ModelSection section;
    section.family = family;
    section.overrides = YAML::Load("{family: " + family + ", " + overrides + "}");
    try {
      make_model(section, "run.yaml");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(built)");
  };
  for (const std::string family : {"beam", "flint", "inkling2"}) {
    INFO(family);
    CHECK_THAT(error_of(family, "num_key_value_heads: 3"),
               Catch::Contains("model.num_key_value_heads: must divide num_attention_heads (4), got 3"));
    CHECK_THAT(error_of(family, "unpadded_vocab_size: 300"),
               Catch::Contains("model.unpadded_vocab_size: must be in [1, vocab_size = 256], got 300"));
  }
  CHECK_THAT(error_of("beam", "n_routed_experts: 3"), Catch::Contains("model.n_group: must divide n_routed_experts (3), got 2"));
  CHECK_THAT(error_of("inkling2", "topk_group: 2"), Catch::Contains("model.topk_group: must be in [1, n_group = 1], got 2"));
  CHECK_THAT(error_of("beam", "num_experts_per_tok: 6"),
             Catch::Contains("model.topk_group: the kept groups must hold at least num_experts_per_tok (6) experts; "
                             "1 of 2 groups hold 4"));
}
