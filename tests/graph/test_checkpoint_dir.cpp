// Training checkpoint directories: save/load round trip, keep rotation, saves killed part-way
// (the earlier checkpoints stay loadable), replacing a step, and validation on load.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/json_file.hpp"
#include "graph/checkpoint/durable_file.hpp"
#include "graph/checkpoint/manifest.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using namespace atl::checkpoint_testing;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

CheckpointContents make_contents(std::int64_t step, std::uint64_t seed) {
  CheckpointContents c;
  c.step = step;
  const std::vector<std::pair<std::string, Shape>> params = {
      {"model.embed_tokens.weight", {11, 4}}, {"model.norm.weight", {4}}, {"lm_head.weight", {11, 4}},
      {"model.layers.0.mlp.experts.gate_and_up_projs", {2, 4, 6}}};
  std::uint64_t s = seed;
  for (const auto& [name, shape] : params) {
    c.model.insert(name, random_f32(shape, s++));
    c.exp_avg.insert(name, random_f32(shape, s++));
    Tensor second = random_f32(shape, s++);
    for (float& v : second.span<float>()) v = std::abs(v);  // a second moment is >= 0
    c.exp_avg_sq.insert(name, second);
  }
  c.trainer_state = {{"data_cursor", {{"document", 17 + step}, {"offset", 3}}},
                     {"seed", seed},
                     {"config", {{"lr", 3e-4}, {"precision", "bf16"}}}};
  c.model_config = {{"model_type", "beam"}, {"hidden_size", 4}, {"vocab_size", 11}};
  return c;
}

std::string load_error(const fs::path& dir) {
  try {
    load_checkpoint(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL("loading " << dir << " raised no CheckpointError");
  return {};
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void check_same(const CheckpointContents& loaded, const CheckpointContents& saved) {
  CHECK(loaded.step == saved.step);
  CHECK(same_tensors(loaded.model, saved.model));
  CHECK(same_tensors(loaded.exp_avg, saved.exp_avg));
  CHECK(same_tensors(loaded.exp_avg_sq, saved.exp_avg_sq));
  json expected_state = saved.trainer_state;
  expected_state["step"] = saved.step;
  CHECK(loaded.trainer_state == expected_state);
  CHECK(loaded.model_config == saved.model_config);
}

}  // namespace

TEST_CASE("durable file: a file that cannot be made is named as asked, not by its temporary name", "[checkpoint]") {
  const fs::path target = "/nonexistent-atoll-dir/x.json";
  try {
    write_file_durably(target, "{}");
    FAIL("no error");
  } catch (const FileWriteError& e) {
    CHECK(std::string(e.what()) == target.string() + ": cannot create (writing a temporary beside it): No such file "
                                                      "or directory");
  }
}

TEST_CASE("durable file: the temporaries of a writer that died are removed by the next write, a live one's stay",
          "[checkpoint]") {
  TempDir tmp;
  const pid_t child = ::fork();  // a pid that is gone once reaped
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string here = std::string(host) + "-";
  const fs::path dead_file = tmp.path / (".run.json.tmp-" + here + std::to_string(child));
  const fs::path dead_folder = tmp.path / (".tmp-hf-" + here + std::to_string(child));  // an export's, with its files
  const fs::path live_file = tmp.path / (".run.json.tmp-" + here + std::to_string(::getppid()));
  const fs::path other = tmp.path / (".other.json.tmp-" + here + std::to_string(child));  // another file's
  // Another machine's, on a shared file system: its pid says nothing here.
  const fs::path elsewhere = tmp.path / (".run.json.tmp-not-" + here + std::to_string(child));
  for (const auto& f : {dead_file, live_file, other, elsewhere}) write_bytes(f, "partial");
  fs::create_directories(dead_folder);
  write_bytes(dead_folder / "model.safetensors", "partial");
  for (const auto& f : {dead_file, live_file, other, elsewhere, dead_folder}) REQUIRE(fs::exists(f));
  write_file_durably(tmp.path / "run.json", "{}\n");
  CHECK_FALSE(fs::exists(dead_file));
  CHECK(fs::exists(live_file));
  CHECK(fs::exists(other));
  CHECK(fs::exists(elsewhere));
  CHECK(fs::exists(dead_folder));  // not this file's prefix
  remove_abandoned_temporaries(tmp.path, ".tmp-hf-");
  CHECK_FALSE(fs::exists(dead_folder));
  CHECK(fs::exists(live_file));
  CHECK(read_bytes(tmp.path / "run.json") == "{}\n");
}

TEST_CASE("durable file: a name near the 255-byte limit gets a temporary that fits, found again when abandoned",
          "[checkpoint]") {
  CHECK(temporary_prefix(".", "run.json", ".tmp-") == ".run.json.tmp-");  // short names as they are
  const std::string long_a(250, 'a'), long_b = std::string(249, 'a') + "b";
  const std::string a = temporary_prefix(".", long_a, ".tmp-"), b = temporary_prefix(".", long_b, ".tmp-");
  CHECK(a.size() + 64 + 1 + 10 <= 255);  // with the longest host name and pid
  CHECK(a == temporary_prefix(".", long_a, ".tmp-"));
  CHECK(a != b);  // cut at the same place, told apart by the hash of the whole
  CHECK(a.rfind(".aaaa", 0) == 0);
  CHECK(a.substr(a.size() - 5) == ".tmp-");

  TempDir tmp;
  write_file_durably(tmp.path / long_a, "written\n");  // the temporary was 256 bytes and more: ENAMETOOLONG
  CHECK(read_bytes(tmp.path / long_a) == "written\n");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);
  const fs::path abandoned = tmp.path / (a + temporary_tag().substr(0, temporary_tag().rfind('-') + 1) +
                                         std::to_string(child));
  write_bytes(abandoned, "partial");
  write_file_durably(tmp.path / long_a, "again\n");
  CHECK_FALSE(fs::exists(abandoned));
  CHECK(read_bytes(tmp.path / long_a) == "again\n");
}

TEST_CASE("durable file: a write past the file size limit fails, naming the file, and leaves the old one whole",
          "[checkpoint]") {
  TempDir tmp;
  const fs::path target = tmp.path / "state.json";
  write_file_durably(target, "old contents\n");
  // ulimit -f: a write past it fails with EFBIG once SIGXFSZ (default: end the process) is ignored,
  // as the apps do. Restored on the way out.
  struct LimitFileSize {
    rlimit saved{};
    void (*handler)(int);
    LimitFileSize() : handler(std::signal(SIGXFSZ, SIG_IGN)) {
      getrlimit(RLIMIT_FSIZE, &saved);
      rlimit small = saved;
      small.rlim_cur = 4096;
      REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    }
    ~LimitFileSize() {
      setrlimit(RLIMIT_FSIZE, &saved);
      std::signal(SIGXFSZ, handler);
    }
  };
  {
    LimitFileSize limit;
    try {
      write_file_durably(target, std::string(10000, 'x'));
      FAIL("no error");
    } catch (const FileWriteError& e) {
      CHECK(std::string(e.what()) == target.string() + ": write failed (its temporary is removed): File too large");
    }
  }
  CHECK(read_bytes(target) == "old contents\n");
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);  // no temporary left
}

TEST_CASE("checkpoint dir: save and load round-trip bitwise", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  CheckpointContents saved = make_contents(10, 1);
  fs::path dir = save_checkpoint(root, saved, 0);

  CHECK(dir == root / "step-00000010");
  CHECK(checkpoint_dir_name(10) == "step-00000010");
  CHECK(entries(root) == std::vector<std::string>{"step-00000010"});
  CHECK(entries(dir) == std::vector<std::string>{"COMPLETE", "config.json", "model.safetensors", "optimizer.safetensors",
                                                 "trainer_state.json"});
  SafetensorsContents optimizer = read_safetensors(dir / "optimizer.safetensors");
  CHECK(optimizer.tensors.names().size() == 2 * saved.model.names().size());
  CHECK(same_bits(optimizer.tensors.at("exp_avg.lm_head.weight"), saved.exp_avg.at("lm_head.weight")));
  CHECK(same_bits(optimizer.tensors.at("exp_avg_sq.model.norm.weight"), saved.exp_avg_sq.at("model.norm.weight")));
  CHECK(read_safetensors(dir / "model.safetensors").metadata.at("format") == "pt");

  REQUIRE(latest_checkpoint(root) == dir);
  CheckpointContents loaded = load_checkpoint(dir);
  check_same(loaded, saved);
  CHECK(loaded.exp_avg.names() == loaded.model.names());  // moments follow the model's order
  CHECK(load_checkpoint(dir.string() + "/").step == 10);

  CHECK(!latest_checkpoint(tmp.path / "nowhere").has_value());
}

TEST_CASE("checkpoint dir: keep rotation removes the oldest complete checkpoints", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  for (std::int64_t step : {1, 2, 3}) save_checkpoint(root, make_contents(step, 10 + step), 0);
  CHECK(complete_checkpoints(root).size() == 3);  // keep 0 keeps all

  for (std::int64_t step : {4, 5}) save_checkpoint(root, make_contents(step, 10 + step), 2);
  CHECK(entries(root) == std::vector<std::string>{"step-00000004", "step-00000005"});
  check_same(load_checkpoint(root / "step-00000004"), make_contents(4, 14));

  save_checkpoint(root, make_contents(6, 16), 1);
  CHECK(entries(root) == std::vector<std::string>{"step-00000006"});
  CHECK(latest_checkpoint(root) == root / "step-00000006");
}

TEST_CASE("checkpoint dir: keep rotation never counts or removes step 0, the imported weights", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  save_checkpoint(root, make_contents(0, 10), 1);  // atoll-convert import
  for (std::int64_t step : {2, 4, 6}) save_checkpoint(root, make_contents(step, 10 + step), 2);
  CHECK(entries(root) == std::vector<std::string>{"step-00000000", "step-00000004", "step-00000006"});
  check_same(load_checkpoint(root / "step-00000000"), make_contents(0, 10));
  save_checkpoint(root, make_contents(8, 18), 1);
  CHECK(entries(root) == std::vector<std::string>{"step-00000000", "step-00000008"});
}

TEST_CASE("checkpoint dir: later checkpoints are set aside intact, out of --resume's sight", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  for (std::int64_t step : {2, 4, 6}) save_checkpoint(root, make_contents(step, 10 + step), 0);
  CHECK(checkpoints_after(root, 2) == std::vector<fs::path>{root / "step-00000004", root / "step-00000006"});
  const fs::path aside = root / "superseded-test";
  const auto moved = set_aside_checkpoints_after(root, 2, aside);
  CHECK(moved == std::vector<fs::path>{aside / "step-00000004", aside / "step-00000006"});
  CHECK(entries(root) == std::vector<std::string>{"step-00000002", "superseded-test"});
  CHECK(latest_checkpoint(root) == root / "step-00000002");
  check_same(load_checkpoint(aside / "step-00000006"), make_contents(6, 16));  // whole, still loadable
  // A save (keep rotation, stale temporaries) leaves the folder alone; nothing left to set aside.
  save_checkpoint(root, make_contents(3, 13), 1);
  CHECK(entries(root) == std::vector<std::string>{"step-00000003", "superseded-test"});
  CHECK(set_aside_checkpoints_after(root, 3, root / "other").empty());
  CHECK_FALSE(fs::exists(root / "other"));
}

TEST_CASE("checkpoint dir: a killed save leaves the previous checkpoint the latest and loadable", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  CheckpointContents saved = make_contents(10, 2);
  fs::path good = save_checkpoint(root, saved, 3);

  // Killed while writing into its temporary directory: partial files, no COMPLETE.
  CheckpointContents next = make_contents(20, 3);
  const fs::path partial = root / ".tmp-step-00000020-424242";
  fs::create_directories(partial);
  write_safetensors(partial / "model.safetensors", next.model);
  std::string model_bytes = read_bytes(partial / "model.safetensors");
  write_bytes(partial / "optimizer.safetensors", model_bytes.substr(0, model_bytes.size() / 2));
  // A step directory without COMPLETE (copied by hand, or an older tool that died).
  const fs::path incomplete = root / "step-00000030";
  fs::create_directories(incomplete);
  write_safetensors(incomplete / "model.safetensors", next.model);

  REQUIRE(latest_checkpoint(root) == good);
  check_same(load_checkpoint(good), saved);
  CHECK_THAT(load_error(incomplete), Contains((incomplete / "COMPLETE").string()) && Contains("incomplete"));
  CHECK_THAT(load_error(partial), Contains("COMPLETE"));

  // The next save clears the stale temporaries and leaves foreign directories alone (a user's
  // own .tmp- folder too: an import may go into a folder that holds other things).
  for (const char* stale : {".tmp-replaced-step-00000020-1", ".tmp-retired-step-00000010-2"}) {
    fs::create_directories(root / stale);
  }
  fs::create_directories(root / ".tmp-mydata");
  fs::path after = save_checkpoint(root, next, 3);
  CHECK(entries(root) == std::vector<std::string>{".tmp-mydata", "step-00000010", "step-00000020", "step-00000030"});
  CHECK(latest_checkpoint(root) == after);
  check_same(load_checkpoint(after), next);
}

TEST_CASE("checkpoint dir: saving a step that exists replaces it", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  save_checkpoint(root, make_contents(10, 4), 0);
  CheckpointContents second = make_contents(10, 5);
  REQUIRE(!same_tensors(second.model, make_contents(10, 4).model));
  fs::path dir = save_checkpoint(root, second, 0);
  CHECK(entries(root) == std::vector<std::string>{"step-00000010"});
  check_same(load_checkpoint(dir), second);

  // An incomplete directory under the step's name is replaced too.
  fs::remove(dir / "COMPLETE");
  CHECK(!latest_checkpoint(root).has_value());
  save_checkpoint(root, make_contents(10, 6), 0);
  CHECK(latest_checkpoint(root) == dir);
  check_same(load_checkpoint(dir), make_contents(10, 6));
}

// Rewrites a checkpoint's manifest for its current files, as if a (buggy) writer had saved them.
void reseal(const fs::path& dir) {
  write_bytes(dir / "COMPLETE", make_manifest(dir, 7, "COMPLETE").dump());
}

TEST_CASE("parse_json: nesting up to kMaxJsonDepth parses, one level more is refused", "[checkpoint]") {
  const auto nested = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  CHECK(parse_json(nested(kMaxJsonDepth + 1)).is_array());  // depth counts from 0 at the top
  CHECK_THROWS_AS(parse_json(nested(kMaxJsonDepth + 2)), JsonTooDeep);
  CHECK_THROWS_AS(parse_json("{\"a\": [1,"), nlohmann::json::parse_error);
  int keys = 0;  // the extra callback sees the events
  parse_json(R"({"a": 1, "b": {"c": 2}})", [&](int, nlohmann::json::parse_event_t e, nlohmann::json&) {
    keys += e == nlohmann::json::parse_event_t::key;
    return true;
  });
  CHECK(keys == 3);
}

TEST_CASE("checkpoint dir: load rejects damaged checkpoints naming the file and fault", "[checkpoint]") {
  TempDir tmp;
  int n = 0;
  auto fresh = [&]() {
    return save_checkpoint(tmp.path / ("root" + std::to_string(n++)), make_contents(7, 8), 0);
  };
  const CheckpointContents c = make_contents(7, 8);

  fs::path missing_moment = fresh();
  {
    TensorMap moments;
    for (const auto& name : c.model.names()) moments.insert("exp_avg." + name, c.exp_avg.at(name));
    for (const auto& name : c.model.names()) {
      if (name != "lm_head.weight") moments.insert("exp_avg_sq." + name, c.exp_avg_sq.at(name));
    }
    write_safetensors(missing_moment / "optimizer.safetensors", moments);
  }
  reseal(missing_moment);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(missing_moment),
             Contains((missing_moment / "optimizer.safetensors").string()) && Contains("no exp_avg_sq.lm_head.weight"));

  fs::path wrong_shape = fresh();
  {
    TensorMap moments;
    for (const auto& name : c.model.names()) {
      moments.insert("exp_avg." + name, name == "model.norm.weight" ? random_f32({5}, 1) : c.exp_avg.at(name));
      moments.insert("exp_avg_sq." + name, c.exp_avg_sq.at(name));
    }
    write_safetensors(wrong_shape / "optimizer.safetensors", moments);
  }
  reseal(wrong_shape);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(wrong_shape), Contains("optimizer.safetensors") && Contains("exp_avg.model.norm.weight has shape [5]"));

  fs::path stranger = fresh();
  {
    TensorMap moments = read_safetensors(stranger / "optimizer.safetensors").tensors;
    moments.insert("momentum.lm_head.weight", c.exp_avg.at("lm_head.weight"));
    write_safetensors(stranger / "optimizer.safetensors", moments);
  }
  reseal(stranger);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(stranger), Contains("optimizer.safetensors") && Contains("'momentum.lm_head.weight'"));

  fs::path extra = fresh();
  {
    TensorMap moments = read_safetensors(extra / "optimizer.safetensors").tensors;
    moments.insert("exp_avg.ghost", random_f32({2}, 3));
    write_safetensors(extra / "optimizer.safetensors", moments);
  }
  reseal(extra);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(extra), Contains("optimizer.safetensors") && Contains("no parameter 'ghost'"));

  fs::path truncated_model = fresh();
  fs::resize_file(truncated_model / "model.safetensors", fs::file_size(truncated_model / "model.safetensors") - 1);
  reseal(truncated_model);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(truncated_model), Contains((truncated_model / "model.safetensors").string()) && Contains("truncated"));

  fs::path bad_state = fresh();
  write_bytes(bad_state / "trainer_state.json", "{\"step\": 7,");
  reseal(bad_state);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(bad_state), Contains((bad_state / "trainer_state.json").string()) && Contains("invalid JSON"));

  // JSON nested past 100 levels is refused while parsing (quoting it in a message recursed per level).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  fs::path deep_state = fresh();
  write_bytes(deep_state / "trainer_state.json", "{\"step\": 7, \"x\": " + deep + "}");
  reseal(deep_state);
  CHECK_THAT(load_error(deep_state),
             Contains((deep_state / "trainer_state.json").string()) && Contains("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"));
  fs::path deep_config = fresh();
  write_bytes(deep_config / "config.json", "{\"hidden_size\": " + deep + "}");
  reseal(deep_config);
  CHECK_THAT(load_error(deep_config),
             Contains((deep_config / "config.json").string()) && Contains("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"));

  fs::path wrong_step = fresh();
  write_bytes(wrong_step / "trainer_state.json", "{\"step\": 8}");
  reseal(wrong_step);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(wrong_step), Contains("trainer_state.json") && Contains("does not match the directory name"));

  fs::path no_step = fresh();
  write_bytes(no_step / "trainer_state.json", "{\"seed\": 8}");
  reseal(no_step);  // a consistent manifest: the file itself must be refused
  CHECK_THAT(load_error(no_step), Contains("trainer_state.json") && Contains("\"step\""));

  fs::path no_config = fresh();
  fs::remove(no_config / "config.json");
  CHECK_THAT(load_error(no_config), Contains((no_config / "config.json").string()) && Contains("missing"));

  fs::path no_optimizer = fresh();
  fs::remove(no_optimizer / "optimizer.safetensors");
  CHECK_THAT(load_error(no_optimizer), Contains((no_optimizer / "optimizer.safetensors").string()));

  CHECK_THAT(load_error(tmp.path / "absent"), Contains("absent") && Contains("not a checkpoint directory"));
}

TEST_CASE("checkpoint dir: the manifest refuses a flipped byte, a foreign file and a bogus marker", "[checkpoint]") {
  TempDir tmp;
  int n = 0;
  auto fresh = [&]() { return save_checkpoint(tmp.path / ("root" + std::to_string(n++)), make_contents(7, 8), 0); };

  const fs::path flipped = fresh();
  {
    // One bit of the last tensor byte (data, not header): still a well-formed safetensors file.
    std::fstream f(flipped / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char byte = 0;
    f.get(byte);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(byte ^ 0x10));
  }
  CHECK_THAT(load_error(flipped), Contains((flipped / "model.safetensors").string()) && Contains("checksum differs"));

  const fs::path foreign = fresh();
  write_bytes(foreign / "model-00002-of-00002.safetensors", "x");
  CHECK_THAT(load_error(foreign), Contains("model-00002-of-00002.safetensors") && Contains("not in its manifest"));

  const fs::path bogus = fresh();
  write_bytes(bogus / "COMPLETE", "done, trust me\n");
  CHECK_THAT(load_error(bogus), Contains((bogus / "COMPLETE").string()) && Contains("not a checkpoint manifest"));

  // A checkpoint written before manifests (COMPLETE holds the step) still loads.
  const fs::path legacy = fresh();
  write_bytes(legacy / "COMPLETE", "7\n");
  CHECK(load_checkpoint(legacy).step == 7);
  CHECK_FALSE(verify_manifest(legacy, "COMPLETE"));
  CHECK(verify_manifest(fresh(), "COMPLETE"));
}

TEST_CASE("checkpoint dir: save refuses inconsistent contents and writes nothing", "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  CheckpointContents bad = make_contents(3, 9);
  TensorMap moments;
  for (const auto& name : bad.model.names()) {
    moments.insert(name, name == "lm_head.weight" ? random_f32({4, 11}, 1) : bad.exp_avg_sq.at(name));
  }
  bad.exp_avg_sq = moments;
  try {
    save_checkpoint(root, bad, 0);
    FAIL("save_checkpoint accepted mismatched exp_avg_sq");
  } catch (const CheckpointError& e) {
    CHECK_THAT(std::string(e.what()), Contains("step-00000003") && Contains("exp_avg_sq.lm_head.weight has shape [4, 11]"));
  }
  CheckpointContents wrong_step = make_contents(3, 9);
  wrong_step.trainer_state["step"] = 4;
  CHECK_THROWS_AS(save_checkpoint(root, wrong_step, 0), CheckpointError);
  CHECK(!latest_checkpoint(root).has_value());
  CHECK((!fs::exists(root) || fs::is_empty(root)));
}

TEST_CASE("checkpoint dir: a save process killed at arbitrary points leaves a loadable latest checkpoint",
          "[checkpoint]") {
  TempDir tmp;
  const fs::path root = tmp.path / "ckpt";
  // Big enough (about 1 MiB a save) that kills land inside writes, renames and rotations.
  auto contents = [](std::int64_t step) {
    CheckpointContents c = make_contents(step, static_cast<std::uint64_t>(step));
    c.model.insert("big", random_f32({256, 256}, static_cast<std::uint64_t>(step)));
    c.exp_avg.insert("big", random_f32({256, 256}, 1000 + static_cast<std::uint64_t>(step)));
    Tensor second = random_f32({256, 256}, 2000 + static_cast<std::uint64_t>(step));
    for (float& v : second.span<float>()) v = std::abs(v);
    c.exp_avg_sq.insert("big", second);
    return c;
  };
  std::int64_t next_step = 1;
  for (int round = 0; round < 4; ++round) {
    INFO("round " << round);
    const std::int64_t first = next_step;
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        for (std::int64_t step = first;; ++step) save_checkpoint(root, contents(step), 2);
      } catch (...) {
        ::_exit(1);
      }
    }
    // Wait until this round's child has finished at least one save, then kill it a little later.
    // (A deadlock watchdog, not a timing claim: a slow disk may take seconds over ten fsyncs.)
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    auto saved_once = [&] { return latest_checkpoint(root) && *latest_checkpoint(root) >= root / checkpoint_dir_name(first); };
    while (!saved_once() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!saved_once()) ::kill(child, SIGKILL);  // (not left running when the check below fails)
    REQUIRE(saved_once());
    std::this_thread::sleep_for(std::chrono::milliseconds(3 + 7 * round));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status));

    std::optional<fs::path> latest = latest_checkpoint(root);
    REQUIRE(latest.has_value());
    CheckpointContents loaded = load_checkpoint(*latest);
    CHECK(loaded.step >= first);
    check_same(loaded, contents(loaded.step));
    for (const auto& dir : complete_checkpoints(root)) CHECK(load_checkpoint(dir).step > 0);
    next_step = loaded.step + 1;
  }
  // The next save cleans up whatever the kills left behind.
  save_checkpoint(root, contents(next_step), 2);
  for (const auto& name : entries(root)) CHECK(name.rfind("step-", 0) == 0);
  CHECK(complete_checkpoints(root).size() == 2);
}

TEST_CASE("enclosing_checkpoint: a saved checkpoint at or above a path, not any folder with a COMPLETE file",
          "[checkpoint]") {
  TempDir tmp;
  const fs::path ck = tmp.path / "run" / "checkpoints" / "step-00000002";
  fs::create_directories(ck);
  write_bytes(ck / "COMPLETE", "{}");
  CHECK_FALSE(enclosing_checkpoint(ck / "sub").has_value());  // a marker alone: a pipeline's "done" file
  write_bytes(ck / "trainer_state.json", "{}");
  const fs::path found = fs::weakly_canonical(ck);
  CHECK(enclosing_checkpoint(ck) == found);
  CHECK(enclosing_checkpoint(ck / "hf" / "model.safetensors") == found);  // not there yet: still inside
  CHECK(enclosing_checkpoint(ck / ".." / "step-00000002" / "x") == found);
  CHECK_FALSE(enclosing_checkpoint(ck / ".." / "step-00000004").has_value());  // beside it
  CHECK_FALSE(enclosing_checkpoint(tmp.path / "run").has_value());             // above it
  fs::create_directory_symlink(ck, tmp.path / "link");
  CHECK(enclosing_checkpoint(tmp.path / "link" / "t.json") == found);
  CHECK_THROWS_WITH(refuse_inside_checkpoint(ck / "hf", "the export"),
                    Contains("the export is or lies inside the saved checkpoint " + found.string()));
}

TEST_CASE("create_directories_durably makes every missing folder, and leaves existing ones", "[checkpoint]") {
  TempDir tmp;
  const fs::path deep = tmp.path / "a" / "b" / "c";
  write_bytes(tmp.path / "keep", "x");
  create_directories_durably(deep.string() + "/");  // ("c/" is c)
  CHECK(fs::is_directory(deep));
  CHECK(entries(tmp.path) == std::vector<std::string>{"a", "keep"});
  create_directories_durably(deep);  // there already: nothing to do
  CHECK(entries(deep).empty());
  CHECK_THROWS_AS(create_directories_durably(tmp.path / "keep" / "inside"), fs::filesystem_error);  // under a file
}
