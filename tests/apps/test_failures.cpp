// atoll-train when training goes wrong or is stopped (docs/failures.md): non-finite losses and
// gradients, skipped steps, SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "graph/checkpoint/manifest.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "tests/apps/app_test_support.hpp"

namespace fs = std::filesystem;
using namespace atl;
using namespace atl::testing;

namespace {

// A small Beam run in `dir` with the given overrides (a sim mesh of 2 ranks unless overridden).
std::vector<std::string> small_run(const fs::path& dir, std::vector<std::string> sets) {
  std::vector<std::string> args = {source_path("configs/beam-tiny.yaml").string(),
                                   "--set",
                                   "run_dir=" + (dir / "run").string(),
                                   "--set",
                                   "checkpoint.dir=" + (dir / "ckpt").string(),
                                   "--set",
                                   "checkpoint.every=1",
                                   "--set",
                                   "train.steps=4",
                                   "--set",
                                   "train.log_every=1"};
  for (auto& s : sets) {
    args.push_back("--set");
    args.push_back(std::move(s));
  }
  return args;
}

std::size_t checkpoints_in(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind("step-", 0) == 0;
  return n;
}

}  // namespace

TEST_CASE("failures: a non-finite gradient stops the run with exit 3 before it is applied or saved",
          "[apps][failures]") {
  TempDir tmp;
  const Result r = run_app("atoll-train", small_run(tmp.path, {"model.init_std=1.0e30"}), tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("step 1:") != std::string::npos);
  CHECK(r.err.find("gradient norm is") != std::string::npos);
  CHECK(r.err.find("first non-finite gradient: model.") != std::string::npos);
  CHECK(checkpoints_in(tmp.path / "ckpt") == 0);  // no checkpoint of the poisoned state
  const auto metrics = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(metrics.size() == 1);
  CHECK(metrics[0]["skipped"] == true);
  CHECK(metrics[0]["grad_norm"].is_null());
}

TEST_CASE("failures: a learning rate that blows up stops at the first non-finite step and keeps the earlier checkpoints",
          "[apps][failures]") {
  TempDir tmp;
  const Result r =
      run_app("atoll-train", small_run(tmp.path, {"train.lr=1.0e30", "topology.engine=reference",
                                                  "topology.mesh.dp_shard=1", "train.warmup=0"}),
              tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  const auto metrics = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(metrics.size() >= 2);
  const std::int64_t bad = metrics.back()["step"].get<std::int64_t>();
  CHECK(r.err.find("step " + std::to_string(bad) + ":") != std::string::npos);
  for (std::size_t i = 0; i + 1 < metrics.size(); ++i) CHECK_FALSE(metrics[i].contains("skipped"));
  CHECK(checkpoints_in(tmp.path / "ckpt") == static_cast<std::size_t>(bad - 1));  // the good steps only
}

TEST_CASE("failures: an update that leaves non-finite weights after a finite step is exit 3 at its save, nothing written",
          "[apps][failures]") {
  TempDir tmp;
  // Step 1's loss and gradient norm are finite; AdamW's first update at this rate is not.
  const Result r = run_app("atoll-train", small_run(tmp.path, {"train.lr=1.0e38", "train.warmup=0", "train.grad_clip=0"}),
                           tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.err, Catch::Contains("non-finite training: step 1: the update left values a checkpoint may not hold") &&
                        Catch::Contains("lower train.lr") && Catch::Contains("checkpoint.dir holds no checkpoint"));
  CHECK(checkpoints_in(tmp.path / "ckpt") == 0);
  CHECK(read_metrics(tmp.path / "run" / "metrics.jsonl").size() == 1);

  // With skip_step the steps after it are skipped (NaN loss) and change nothing: the save at step
  // 3 names step 1, the update that left the values, not step 3.
  const Result skip = run_app("atoll-train",
                              small_run(tmp.path / "skip", {"train.lr=1.0e38", "train.warmup=0", "train.grad_clip=0",
                                                            "train.on_nonfinite=skip_step", "checkpoint.every=3"}),
                              tmp.path);
  INFO(skip.out << skip.err);
  CHECK(skip.exit_code == 3);
  CHECK_THAT(skip.err, Catch::Contains("non-finite training: step 3 (skipped): the update of step 1, the last one "
                                       "applied, left values a checkpoint may not hold (usually"));
  CHECK(checkpoints_in(tmp.path / "skip" / "ckpt") == 0);
}

TEST_CASE("failures: a checkpoint the file system refuses is exit 1, named, and leaves nothing half-written",
          "[apps][failures]") {
  TempDir tmp;
  // A full disk, a quota or an I/O error, stood in for by the file size limit (300 KiB: the run's
  // outputs fit, the 1.2 MB weights do not).
  std::vector<std::string> words = small_run(tmp.path, {});
  words.insert(words.begin(), app_binary("atoll-train").string());
  // Appended word by word: "..." + std::string trips GCC 12's -Wrestrict false alarm here.
  std::string command = "ulimit -f 300 && exec";
  for (const auto& word : words) command.append(" ").append(shell_quote(word));
  const Result r = run_shell(command, tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);  // not 2: the input is fine, and a launcher may restart
  CHECK_THAT(r.err, Catch::Contains("the checkpoint of step 1 was not saved: ") &&
                        Catch::Contains("model.safetensors: write failed (its temporary is removed): File too large") &&
                        Catch::Contains("checkpoint.dir holds no checkpoint"));
  REQUIRE(fs::is_directory(tmp.path / "ckpt"));
  CHECK(fs::is_empty(tmp.path / "ckpt"));  // no checkpoint, no temporary

  // metrics.jsonl past 4 KiB (about 12 steps' lines): the run stops rather than train unrecorded.
  words = small_run(tmp.path / "m", {"checkpoint.every=0", "train.steps=30"});
  words.insert(words.begin(), app_binary("atoll-train").string());
  command = "ulimit -f 4 && exec";
  for (const auto& word : words) command.append(" ").append(shell_quote(word));
  const Result m = run_shell(command, tmp.path);
  INFO(m.out << m.err);
  CHECK(m.exit_code == 1);
  CHECK_THAT(m.err, Catch::Contains("metrics.jsonl: cannot append step ") && Catch::Contains("line: File too large"));
  CHECK(m.out.find("step    30/30") == std::string::npos);
  // The part of the failed line that fitted is cut off again: whole JSON lines only.
  const std::string metrics = read_file(tmp.path / "m" / "run" / "metrics.jsonl");
  REQUIRE(!metrics.empty());
  CHECK(metrics.back() == '\n');
  const std::vector<nlohmann::json> lines = read_metrics(tmp.path / "m" / "run" / "metrics.jsonl");
  CHECK(lines.size() >= 5);  // some steps' lines before the limit
}

TEST_CASE("failures: an export or import the file system refuses is exit 1, named by its output, nothing left",
          "[apps][failures]") {
  TempDir tmp;
  REQUIRE(run_app("atoll-train", small_run(tmp.path, {"train.steps=1"}), tmp.path).exit_code == 0);
  const fs::path checkpoint = tmp.path / "ckpt" / "step-00000001", out = tmp.path / "hf";
  const auto limited = [&](const std::vector<std::string>& args) {  // 300 KiB: config.json fits, the weights not
    std::string command = "ulimit -f 300 && exec " + shell_quote(app_binary("atoll-convert").string());
    for (const auto& word : args) command.append(" ").append(shell_quote(word));
    return run_shell(command, tmp.path);
  };
  const Result e = limited({"export", checkpoint.string(), out.string()});
  INFO(e.err);
  CHECK(e.exit_code == 1);
  // OUT first (it named only the temporary: .tmp-hf-<host>-<pid>/model.safetensors).
  CHECK_THAT(e.err, Catch::Contains(out.string() + ": the export could not be written (nothing is left of it): ") &&
                        Catch::Contains("model.safetensors: write failed"));
  CHECK_FALSE(fs::exists(out));
  const auto leftovers = [&](const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
    return names;
  };
  for (const auto& name : leftovers(tmp.path)) CHECK(name.rfind(".tmp-", 0) != 0);

  REQUIRE(run_app("atoll-convert", {"export", checkpoint.string(), out.string()}, tmp.path).exit_code == 0);
  const fs::path root = tmp.path / "imported";
  const Result i = limited({"import", out.string(), root.string()});
  INFO(i.err);
  CHECK(i.exit_code == 1);
  CHECK_THAT(i.err, Catch::Contains((root / "step-00000000").string() + ": the import could not be written") &&
                        Catch::Contains("write failed"));
  CHECK_FALSE(fs::exists(root));
}

TEST_CASE("failures: an export or import output named past 255 bytes is exit 2 before any work, the name shown",
          "[apps][failures]") {
  TempDir tmp;
  REQUIRE(run_app("atoll-train", small_run(tmp.path, {"train.steps=1"}), tmp.path).exit_code == 0);
  const fs::path checkpoint = tmp.path / "ckpt" / "step-00000001";
  const std::string long_name(256, 'n');
  const Result e = run_app("atoll-convert", {"export", checkpoint.string(), (tmp.path / long_name / "hf").string()}, tmp.path);
  INFO(e.err);
  CHECK(e.exit_code == 2);  // (it was exit 1: "filesystem error: status: File name too long")
  CHECK_THAT(e.err, Catch::Contains("the name 'nnnnnnnnnnnnnnnnnnnnnnnn...' in '" + tmp.path.string() +
                                    "' has 256 bytes; expected at most 255"));
  REQUIRE(run_app("atoll-convert", {"export", checkpoint.string(), (tmp.path / "hf").string()}, tmp.path).exit_code == 0);
  const Result i = run_app("atoll-convert", {"import", (tmp.path / "hf").string(), (tmp.path / long_name).string()}, tmp.path);
  INFO(i.err);
  CHECK(i.exit_code == 2);
  CHECK_THAT(i.err, Catch::Contains("' has 256 bytes; expected at most 255"));
}

TEST_CASE("failures: on_nonfinite skip_step drops steps and stops after max_skipped_steps", "[apps][failures]") {
  TempDir tmp;
  const Result r = run_app(
      "atoll-train",
      small_run(tmp.path, {"model.init_std=1.0e30", "train.on_nonfinite=skip_step", "train.max_skipped_steps=2"}),
      tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("more than train.max_skipped_steps (2)") != std::string::npos);
  CHECK(r.out.find("skipped:") != std::string::npos);
  const auto metrics = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(metrics.size() == 3);
  for (std::size_t i = 0; i < metrics.size(); ++i) CHECK(metrics[i]["skipped_steps"] == i + 1);
  // Skipped steps leave the state untouched, so their checkpoints hold the same (initial) weights
  // and moments.
  REQUIRE(checkpoints_in(tmp.path / "ckpt") == 2);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    INFO(file);
    CHECK(read_file(tmp.path / "ckpt" / "step-00000001" / file) == read_file(tmp.path / "ckpt" / "step-00000002" / file));
  }
}

TEST_CASE("failures: train.on_nonfinite accepts stop and skip_step only", "[apps][failures]") {
  TempDir tmp;
  const Result r = run_app("atoll-train", small_run(tmp.path, {"train.on_nonfinite=ignore"}), tmp.path);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("train.on_nonfinite") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "run"));
}

namespace {

// Starts atoll-train with `args` (stdout, stderr to files in `scratch`); returns its pid.
pid_t spawn_train(const std::vector<std::string>& args, const fs::path& scratch) {
  const std::string binary = app_binary("atoll-train").string();
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, (scratch / "stdout.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, 2, (scratch / "stderr.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, binary.c_str(), &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  REQUIRE(rc == 0);
  return pid;
}

// A run started in the background, once it has logged two steps: `signal` to it, then its exit
// status (waited for).
int signal_mid_run(const std::vector<std::string>& args, const fs::path& run_dir, const fs::path& cwd, int signal) {
  const pid_t pid = spawn_train(args, cwd);
  for (int i = 0; i < 600 && complete_lines(run_dir / "metrics.jsonl") < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(complete_lines(run_dir / "metrics.jsonl") >= 2);
  REQUIRE(kill(pid, signal) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("failures: SIGTERM finishes the step, saves, exits 143, and --resume reaches the uninterrupted result",
          "[apps][failures][signals]") {
  TempDir tmp;
  const fs::path stopped = tmp.path / "stopped", straight = tmp.path / "straight";
  auto args = [&](const fs::path& dir, std::vector<std::string> extra) {
    std::vector<std::string> a = {source_path("configs/beam-tiny.yaml").string(), "--set", "run_dir=" + dir.string(),
                                  "--set", "train.steps=24", "--set", "checkpoint.every=100"};
    for (auto& e : extra) {
      a.push_back("--set");
      a.push_back(std::move(e));
    }
    return a;
  };
  // Slowed down by an injected all-gather delay (it changes no number) so the signal lands mid-run.
  const int status = signal_mid_run(args(stopped, {"topology.sim_delay_ms={all_gather: 25}"}), stopped, tmp.path,
                                    SIGTERM);
  const std::string err = read_file(tmp.path / "stderr.txt");
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 143);
  CHECK(err.find("stopped by SIGTERM after step") != std::string::npos);
  CHECK(err.find("--resume") != std::string::npos);
  const std::size_t done = complete_lines(stopped / "metrics.jsonl");
  REQUIRE(done < 24);  // it really stopped early
  char name[32];
  std::snprintf(name, sizeof name, "step-%08zu", done);
  CHECK(fs::exists(stopped / "checkpoints" / name / "COMPLETE"));  // the last finished step, saved

  const Result resumed = run_app("atoll-train", [&] {
    auto a = args(stopped, {});
    a.push_back("--resume");
    return a;
  }(), tmp.path);
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  const Result whole = run_app("atoll-train", args(straight, {}), tmp.path);
  REQUIRE(whole.exit_code == 0);
  CHECK(metrics_without_timing(stopped / "metrics.jsonl") == metrics_without_timing(straight / "metrics.jsonl"));

  // The reference trainer stops before its next step, by the signal it was sent (its own).
  const fs::path reference = tmp.path / "reference";
  const int ref_status =
      signal_mid_run(args(reference, {"topology.engine=reference", "train.steps=2000"}), reference, tmp.path, SIGTERM);
  const std::string ref_err = read_file(tmp.path / "stderr.txt");
  INFO(ref_err);
  REQUIRE(WIFEXITED(ref_status));
  CHECK(WEXITSTATUS(ref_status) == 143);  // (not 0: the 2000 steps did not all run)
  const std::size_t ref_done = complete_lines(reference / "metrics.jsonl");
  CHECK(ref_done < 2000);
  CHECK_THAT(ref_err, Catch::Contains("atoll-train: stopped by SIGTERM after step " + std::to_string(ref_done) + " of") &&
                          !Catch::Contains("another process"));
}

TEST_CASE("failures: bad config inputs and output paths exit 2 at once, name the problem and write nothing",
          "[apps][failures][config]") {
  TempDir tmp;
  const fs::path file = tmp.path / "a-file";
  write_file(file, "x");
  const fs::path base = source_path("configs/beam-tiny.yaml");
  const std::string run_dir = "run_dir=" + (tmp.path / "run").string();
  std::string binary;
  for (int i = 0; i < 5000; ++i) binary += static_cast<char>(i % 256);
  write_file(tmp.path / "binary.yaml", binary);
  write_file(tmp.path / "deep.yaml", "model: {family: beam}\nx: " + std::string(500, '[') + std::string(500, ']') + "\n");
  write_file(tmp.path / "dup.yaml", "model: {family: beam}\ntrain: {steps: 2, global_batch: 4, micro_batch: 2,\n"
                                    "  seq_len: 32, lr: 1.0e-3, steps: 3}\n");
  write_file(tmp.path / "long.yaml", "model: {family: " + std::string(5000, 'q') + "}\n");
  fs::create_directories(tmp.path / "with-dir" / "metrics.jsonl");
  struct Case {
    const char* what;
    std::vector<std::string> args;
    std::vector<std::string> expected;  // all in stderr
  };
  const std::vector<Case> cases = {
      {"a directory as the config", {tmp.path.string()}, {"is a directory", "YAML config file"}},
      {"a binary config", {(tmp.path / "binary.yaml").string()}, {"not a text file", "byte 0"}},
      {"nesting 500 deep", {(tmp.path / "deep.yaml").string()}, {"line 2", "nested more than 64 levels"}},
      {"a duplicated key", {(tmp.path / "dup.yaml").string()}, {"train.steps", "duplicated key (line 3)"}},
      {"a 5000-character value", {(tmp.path / "long.yaml").string()}, {"model.family", "(5000 characters)"}},
      {"a data key for another source", {base.string(), "--set", "data.token_width=2"},
       {"data.token_width", "applies to data.source: tokens:<path> only"}},
      {"an AdamW eps fp32 cannot hold", {base.string(), "--set", "train.adam_eps=1.0e-46"},
       {"train.adam_eps", ">= 1.2e-38"}},
      {"a synthetic key for a file source", {base.string(), "--set", "data.source=text:" + base.string(), "--set",
                                             "data.synthetic_branching=3"},
       {"data.synthetic_branching", "applies to data.source: synthetic only"}},
      {"more synthetic successors than the model has tokens", {base.string(), "--set", "data.synthetic_branching=251"},
       {base.string() + ": data.synthetic_branching", "expected an integer in [1, 250]",
        "(given by --set data.synthetic_branching=251)"}},
      {"a model key the family refuses, from --set", {base.string(), "--set", "model.hidden_size=-1"},
       {base.string() + ": model.hidden_size: expected a positive integer, got -1 (given by --set model.hidden_size=-1)"}},
      {"a text source without its path", {base.string(), "--set", "data.source=text:"},
       {"data.source", "'text:' names no file; expected 'text:<path>'"}},
      {"run_dir is a file", {base.string(), "--set", "run_dir=" + file.string()}, {"run_dir", "not a directory"}},
      {"a directory where run_dir's metrics.jsonl goes",
       {base.string(), "--set", "run_dir=" + (tmp.path / "with-dir").string()},
       {"run_dir", "with-dir/metrics.jsonl' is a directory"}},
      {"checkpoint.dir under a file",
       {base.string(), "--set", "checkpoint.every=2", "--set", "checkpoint.dir=" + (file / "ck").string()},
       {"checkpoint.dir", "is not a directory"}},
      {"--trace under a file", {base.string(), "--trace", (file / "trace.json").string()},
       {"--trace", "is not a directory"}},
      {"--trace named past a file name's 255 bytes (found only at the write, after the run)",
       {base.string(), "--trace", (tmp.path / std::string(256, 't')).string()},
       {"--trace", "the name 'tttttttttttttttttttttttt...' in '", "' has 256 bytes; expected at most 255"}},
      {"--trace with the reference engine (no spans to write: refused before training, not after)",
       {base.string(), "--set", "topology.engine=reference", "--trace", (tmp.path / "trace.json").string()},
       {"topology.engine", "--trace records the actor runtime's spans"}},
      // /sys refuses new entries even to root, whom access(2) lets through where /sys is mounted
      // read-write (as here); where it is read-only, access(2) would refuse it too.
      {"checkpoint.dir where nothing can be created",
       {base.string(), "--set", "checkpoint.every=2", "--set", "checkpoint.dir=/sys/atoll-test/ck"},
       {"checkpoint.dir", "cannot create '/sys/atoll-test/ck'", "'/sys' is not writable"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    std::vector<std::string> args = c.args;
    if (c.args.size() == 1 || c.args[2].rfind("run_dir=", 0) != 0) {
      args.push_back("--set");
      args.push_back(run_dir);
    }
    const Result r = run_app("atoll-train", args, tmp.path);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    for (const auto& e : c.expected) CHECK(r.err.find(e) != std::string::npos);
    CHECK(r.err.size() < 400);  // one line, no echo of the input
    CHECK_FALSE(fs::exists(tmp.path / "run"));
  }
  // The tools that take --set name it for keys checked after the config is read (model keys).
  {
    const std::string expected = base.string() + ": model.hidden_size: expected a positive integer, got 0 (given by --set model.hidden_size=0)";
    const std::vector<std::pair<std::string, std::vector<std::string>>> tools = {
        {"atoll-plan", {base.string()}},
        {"atoll-eval", {base.string(), "--checkpoint", tmp.path.string()}}};  // atoll-convert: the HF import test
    for (const auto& [tool, args] : tools) {
      INFO(tool);
      std::vector<std::string> with_set = args;
      with_set.insert(with_set.end(), {"--set", "model.hidden_size=0"});
      const Result r = run_app(tool, with_set, tmp.path);
      INFO(r.err);
      CHECK(r.exit_code == 2);
      CHECK(r.err.find(expected) != std::string::npos);
    }
  }
  // A bad kernel-level cap in the environment is bad input too, for training and evaluation.
  for (const char* app : {"atoll-train", "atoll-eval"}) {
    INFO(app);
    std::string command = "ATOLL_CPU_ISA=sse " + shell_quote(app_binary(app).string()) + " " +
                          shell_quote(base.string()) + " --set " + shell_quote(run_dir);
    if (std::string(app) == "atoll-eval") command += " --checkpoint " + shell_quote(tmp.path.string());
    const Result r = run_shell(command, tmp.path / "isa");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("ATOLL_CPU_ISA: expected portable, avx2 or avx512, got 'sse'"));
    CHECK_FALSE(fs::exists(tmp.path / "run"));
  }
}

namespace {

// Rewrites one tensor of a safetensors file with `edit`, then the checkpoint's manifest, so the
// checkpoint is self-consistent and only its values are wrong.
void edit_checkpoint_tensor(const fs::path& dir, const std::string& file, const std::string& name,
                            const std::function<Tensor(const Tensor&)>& edit) {
  const TensorMap old = read_safetensors(dir / file).tensors;
  TensorMap updated;
  for (const auto& n : old.names()) updated.insert(n, n == name ? edit(old.at(n).clone()) : old.at(n));
  write_safetensors(dir / file, updated);
  write_file(dir / "COMPLETE", make_manifest(dir, 2, "COMPLETE").dump());
}

fs::path copy_checkpoint(const fs::path& good, const fs::path& to) {
  fs::create_directories(to.parent_path());
  fs::copy(good, to);
  return to;
}

}  // namespace

TEST_CASE("failures: checkpoints with NaN weights, negative second moments, no data cursor or I32 weights are refused",
          "[apps][failures][checkpoint]") {
  TempDir tmp;
  const fs::path config = source_path("configs/beam-tiny.yaml");
  const std::vector<std::string> base = {config.string(), "--set", "run_dir=" + (tmp.path / "run").string(),
                                         "--set", "train.steps=2", "--set", "checkpoint.every=2"};
  REQUIRE(run_app("atoll-train", base, tmp.path).exit_code == 0);
  const fs::path good = tmp.path / "run" / "checkpoints" / "step-00000002";
  auto resume = [&](const fs::path& dir) {
    std::vector<std::string> a = {config.string(), "--set", "run_dir=" + (tmp.path / "resumed").string(),
                                  "--set", "train.steps=4", "--resume", dir.string()};
    return run_app("atoll-train", a, tmp.path);
  };

  const fs::path nan = copy_checkpoint(good, tmp.path / "nan" / "step-00000002");
  edit_checkpoint_tensor(nan, "model.safetensors", "lm_head.weight", [](Tensor t) {
    t.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
    return t;
  });
  Result r = resume(nan);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("weight 'lm_head.weight' holds NaN at element 5") != std::string::npos);
  const std::vector<std::string> eval = {config.string(), "--checkpoint", nan.string(), "--batches", "1"};
  r = run_app("atoll-eval", eval, tmp.path);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--allow-nonfinite") != std::string::npos);
  auto inspect = eval;
  inspect.push_back("--allow-nonfinite");
  r = run_app("atoll-eval", inspect, tmp.path);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);  // loaded for inspection; a NaN loss is still not a success

  const fs::path negative = copy_checkpoint(good, tmp.path / "negative" / "step-00000002");
  edit_checkpoint_tensor(negative, "optimizer.safetensors", "exp_avg_sq.model.norm.weight", [](Tensor t) {
    t.data<float>()[0] = -1.0f;
    return t;
  });
  r = resume(negative);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("exp_avg_sq.model.norm.weight holds -1 at element 0") != std::string::npos);

  const fs::path no_cursor = copy_checkpoint(good, tmp.path / "cursor" / "step-00000002");
  {
    nlohmann::json state = nlohmann::json::parse(read_file(no_cursor / "trainer_state.json"));
    state.erase("data_cursor");
    write_file(no_cursor / "trainer_state.json", state.dump());
    write_file(no_cursor / "COMPLETE", make_manifest(no_cursor, 2, "COMPLETE").dump());
  }
  r = resume(no_cursor);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("\"data_cursor\" is missing") != std::string::npos);

  // A saved config without a key the resume compares (an older or edited file): named, exit 2.
  const fs::path no_seed = copy_checkpoint(good, tmp.path / "seed" / "step-00000002");
  {
    nlohmann::json state = nlohmann::json::parse(read_file(no_seed / "trainer_state.json"));
    state["config"]["train"].erase("seed");
    write_file(no_seed / "trainer_state.json", state.dump());
    write_file(no_seed / "COMPLETE", make_manifest(no_seed, 2, "COMPLETE").dump());
  }
  r = resume(no_seed);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains((no_seed / "trainer_state.json").string() + ": \"config\" has no train.seed"));

  // A data cursor of another kind of source: the checkpoint is named, not only the data.
  const fs::path other_cursor = copy_checkpoint(good, tmp.path / "other-cursor" / "step-00000002");
  {
    nlohmann::json state = nlohmann::json::parse(read_file(other_cursor / "trainer_state.json"));
    state["data_cursor"]["source"] = "documents";
    write_file(other_cursor / "trainer_state.json", state.dump());
    write_file(other_cursor / "COMPLETE", make_manifest(other_cursor, 2, "COMPLETE").dump());
  }
  r = resume(other_cursor);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("data.source does not fit the checkpoint's data position (resumed from " +
                                    other_cursor.string() + " at step 2, trainer_state.json \"data_cursor\")"));

  const fs::path int_weights = copy_checkpoint(good, tmp.path / "i32" / "step-00000002");
  edit_checkpoint_tensor(int_weights, "model.safetensors", "model.norm.weight",
                         [](const Tensor& t) { return t.to(DType::i32); });
  r = run_app("atoll-convert", {"export", int_weights.string(), (tmp.path / "hf").string()}, tmp.path);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("model.norm.weight") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "hf"));

  // A saved config whose model section is not an object: bad input, named.
  auto with_state = [&](const char* name, const std::function<void(nlohmann::json&)>& change) {
    const fs::path dir = copy_checkpoint(good, tmp.path / name / "step-00000002");
    nlohmann::json state = nlohmann::json::parse(read_file(dir / "trainer_state.json"));
    change(state);
    write_file(dir / "trainer_state.json", state.dump());
    write_file(dir / "COMPLETE", make_manifest(dir, 2, "COMPLETE").dump());
    return dir;
  };
  r = resume(with_state("model-list", [](nlohmann::json& s) { s["config"]["model"] = nlohmann::json::array({1}); }));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("trainer_state.json: \"config\".model must be an object"));
  // Saved keys of another kind (they ended in nlohmann's type_error: exit 1, which a launcher restarts).
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> kinds = {
      {[](nlohmann::json& s) { s["config"]["data"]["source"] = 5; }, "\"config\".data.source must be a string, got number"},
      {[](nlohmann::json& s) { s["config"]["model"]["family"] = 7; }, "\"config\".model.family must be a string, got number"},
      {[](nlohmann::json& s) { s["config"]["model"]["preset"] = true; }, "\"config\".model.preset must be a string, got boolean"},
      {[](nlohmann::json& s) { s["config"]["data"] = 3; }, "\"config\".data must be an object, got number"},
  };
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    INFO(kinds[i].second);
    r = resume(with_state(("kind-" + std::to_string(i)).c_str(), kinds[i].first));
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("trainer_state.json: " + kinds[i].second));
  }
  {  // atoll-convert export reads the saved config too
    const fs::path dir = with_state("config-number", [](nlohmann::json& s) { s["config"] = 5; });
    r = run_app("atoll-convert", {"export", dir.string(), (tmp.path / "hf-number").string()}, tmp.path);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("trainer_state.json: \"config\" must be an object (the run config), got number"));
  }
  CHECK_FALSE(fs::exists(tmp.path / "resumed" / "metrics.jsonl"));  // no refused resume wrote anything

  // A sim run saved by an older build with ucx settings it ignored (now refused with sim): exported.
  const fs::path old_build = with_state("old-build", [](nlohmann::json& s) {
    s["config"]["topology"]["ucx_peer_errors"] = false;
    s["config"]["topology"]["heartbeat_timeout_s"] = 9;
  });
  r = run_app("atoll-convert", {"export", old_build.string(), (tmp.path / "hf-old")}, tmp.path);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(fs::exists(tmp.path / "hf-old" / "config.json"));
}

TEST_CASE("failures: HF import builds the model from config.json and refuses a config.json or folder that disagrees",
          "[apps][failures][hf]") {
  TempDir tmp;
  const fs::path config = source_path("configs/beam-tiny.yaml");
  REQUIRE(run_app("atoll-train", {config.string(), "--set", "run_dir=" + (tmp.path / "run").string(), "--set",
                                  "train.steps=1", "--set", "checkpoint.every=1"},
                  tmp.path)
              .exit_code == 0);
  const fs::path ckpt = tmp.path / "run" / "checkpoints" / "step-00000001";
  const fs::path hf = tmp.path / "hf";
  REQUIRE(run_app("atoll-convert", {"export", ckpt.string(), hf.string()}, tmp.path).exit_code == 0);
  // As the ecosystem writes it: no atoll_preset, extra keys atoll does not use.
  nlohmann::json hf_config = nlohmann::json::parse(read_file(hf / "config.json"));
  hf_config.erase("atoll_preset");
  hf_config["torch_dtype"] = "float32";
  hf_config["transformers_version"] = "4.50.0";
  hf_config["rope_scaling"] = nullptr;  // the neutral values of fields atoll does not write
  hf_config["attention_bias"] = false;
  hf_config["hidden_act"] = "silu";
  hf_config["my_lab_tag"] = "run-7";  // unknown to atoll: imported, and named as ignored
  // And as atoll wrote floats before 2026-12: the float widened (0.02f as 0.019999999552965164).
  REQUIRE(hf_config.at("initializer_range").dump() == "0.02");
  hf_config["initializer_range"] = static_cast<double>(0.02f);
  hf_config["rms_norm_eps"] = static_cast<double>(1e-6f);
  write_file(hf / "config.json", hf_config.dump(2));
  Result r = run_app("atoll-convert", {"import", hf.string(), (tmp.path / "in").string()}, tmp.path);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::EndsWith("note: config.json fields atoll does not use were ignored: my_lab_tag\n"));
  const fs::path back = tmp.path / "back";
  REQUIRE(run_app("atoll-convert", {"export", (tmp.path / "in" / "step-00000000").string(), back.string()}, tmp.path)
              .exit_code == 0);
  CHECK(read_file(back / "model.safetensors") == read_file(hf / "model.safetensors"));

  struct Case {
    const char* what;
    std::function<void(const fs::path&)> damage;
    std::vector<std::string> extra;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"a field the run config contradicts",
       [&](const fs::path& d) {
         nlohmann::json c = hf_config;
         c["num_attention_heads"] = 8;
         write_file(d / "config.json", c.dump());
       },
       {"--config", config.string()},
       {"config.json: num_attention_heads: 8 in the file"}},
      {"a model key the family refuses, from --set", [](const fs::path&) {},
       {"--config", config.string(), "--set", "model.hidden_size=0"},
       {"model.hidden_size: expected a positive integer, got 0 (given by --set model.hidden_size=0)"}},
      {"a family atoll does not train",
       [&](const fs::path& d) {
         nlohmann::json c = hf_config;
         c["model_type"] = "llama";
         write_file(d / "config.json", c.dump());
       },
       {},
       {"model_type: 'llama'"}},
      {"a field that does not fit the tensors",
       [&](const fs::path& d) {
         nlohmann::json c = hf_config;
         c["hidden_size"] = 128;
         write_file(d / "config.json", c.dump());
       },
       {},
       {"do not fit the model its config.json describes", "model.embed_tokens.weight"}},
      {"a field atoll does not write, set to change the model",
       [&](const fs::path& d) {
         nlohmann::json c = hf_config;
         c["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
         write_file(d / "config.json", c.dump());
       },
       {},
       {"config.json: rope_scaling: {\"factor\":4.0,\"type\":\"linear\"} in the file, but the model built from it "
        "has null (atoll's beam has no other)"}},
      {"another activation",
       [&](const fs::path& d) {
         nlohmann::json c = hf_config;
         c["hidden_act"] = "gelu";
         write_file(d / "config.json", c.dump());
       },
       {"--config", config.string()},
       {"config.json: hidden_act: \"gelu\" in the file, but the model the run config describes has \"silu\""}},
      {"a training checkpoint given as the HF folder",
       [](const fs::path& d) { write_file(d / "trainer_state.json", "{}"); },
       {},
       {": an atoll training checkpoint (it has trainer_state.json), not an HF model folder"}},
      {"no config.json", [](const fs::path& d) { fs::remove(d / "config.json"); }, {}, {"config.json: missing"}},
      {"no folder at all", [](const fs::path& d) { fs::remove_all(d); }, {},
       {": not an HF model directory (missing or not a directory)"}},
      {"a NaN weight",
       [](const fs::path& d) {
         TensorMap tensors = read_safetensors(d / "model.safetensors").tensors;
         TensorMap out;
         for (const auto& n : tensors.names()) {
           Tensor t = tensors.at(n).clone();
           if (n == "lm_head.weight") t.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
           out.insert(n, t);
         }
         write_safetensors(d / "model.safetensors", out);
       },
       {},
       {"hf9: tensor 'lm_head.weight' holds NaN at element 1: refused"}},  // named by the HF folder
      {"config.json that is not JSON", [](const fs::path& d) { write_file(d / "config.json", "hidden_size = 64"); },
       {}, {"config.json: invalid JSON"}},
      {"both a single file and an index",
       [](const fs::path& d) {
         write_file(d / "model.safetensors.index.json",
                    R"({"metadata": {"total_size": 0}, "weight_map": {}})");
       },
       {},
       {"holds both model.safetensors and model.safetensors.index.json"}},
  };
  int n = 0;
  for (const Case& c : cases) {
    INFO(c.what);
    const fs::path dir = tmp.path / ("hf" + std::to_string(n++));
    fs::copy(hf, dir);
    c.damage(dir);
    std::vector<std::string> args = {"import", dir.string(), (tmp.path / "out").string()};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    r = run_app("atoll-convert", args, tmp.path);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    for (const auto& e : c.expected) CHECK(r.err.find(e) != std::string::npos);
    CHECK_FALSE(fs::exists(tmp.path / "out"));
  }
}

TEST_CASE("failures: runs that cannot fit in memory are refused before they allocate, naming the key",
          "[apps][failures][memory]") {
  TempDir tmp;
  const fs::path config = source_path("configs/beam-tiny.yaml");
  struct Case {
    std::vector<std::string> sets;
    const char* key;
  };
  const std::vector<Case> cases = {
      {{"train.seq_len=100000000"}, "train.seq_len: the run needs about"},
      {{"model.hidden_size=100000000"}, "model: the run needs about"},
      {{"train.global_batch=60000000"}, "train.global_batch: the run needs about"},  // ~55 TB
      {{"train.global_batch=1000000", "train.micro_batch=1000000"}, "train.micro_batch: the run needs about"},
      {{"topology.mesh.dp_shard=2000", "train.global_batch=2000", "train.micro_batch=1"},
       "topology.mesh: the run needs about"},
  };
  for (const Case& c : cases) {
    INFO(c.sets[0]);
    std::vector<std::string> args = {config.string(), "--set", "run_dir=" + (tmp.path / "run").string()};
    for (const auto& s : c.sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const Result r = run_app("atoll-train", args, tmp.path);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.key) != std::string::npos);
    CHECK(r.err.find("GiB available") != std::string::npos);
    CHECK_FALSE(fs::exists(tmp.path / "run"));
  }
  // More tokens per step than sizes can count is a config error before any estimate.
  for (const auto& [set, key] : {std::pair{"train.seq_len=4294967297", "train.seq_len"},
                                 std::pair{"train.global_batch=40000000000", "train.global_batch"}}) {
    INFO(set);
    const Result r = run_app("atoll-train", {config.string(), "--set", "run_dir=" + (tmp.path / "run").string(),
                                             "--set", set}, tmp.path);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(std::string(key) + ": global_batch x seq_len = ") &&
                          Catch::Contains("tokens per step; expected at most 2147483648"));
    CHECK_FALSE(fs::exists(tmp.path / "run"));
  }
}

TEST_CASE("failures: atoll-eval out of memory for its batch says which setting to lower, exit 2", "[apps][failures][memory]") {
  TempDir tmp;
  const fs::path config = source_path("configs/beam-tiny.yaml");
  const Result trained = run_app("atoll-train", {config.string(), "--set", "run_dir=" + (tmp.path / "run").string(),
                                                 "--set", "train.steps=1", "--set", "checkpoint.every=1"},
                                 tmp.path);
  REQUIRE(trained.exit_code == 0);
  // 2^26 tokens in one forward pass under a 3 GB address space (eval has no preflight: it scores
  // what it is given, and a batch is the config's).
  const std::string command =
      "ulimit -v 3000000; " + shell_quote(app_binary("atoll-eval").string()) + " " + shell_quote(config.string()) +
      " --checkpoint " + shell_quote((tmp.path / "run" / "checkpoints" / "step-00000001").string()) +
      " --set train.global_batch=32768 --set train.seq_len=2048 --batches 1";
  const Result r = run_shell(command, tmp.path / "eval");
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::StartsWith("atoll-eval: out of memory: a batch of train.global_batch x train.seq_len tokens") &&
                        Catch::Contains("lower train.global_batch"));
}

TEST_CASE("failures: running out of threads or memory while the actor engine is built or steps exits instead of hanging",
          "[apps][failures][memory]") {
  TempDir tmp;
  // 256 simulated ranks under an address-space limit (the preflight skipped): thread creation or
  // an allocation fails part-way through spawning (3 GB, on most machines) or inside one actor
  // during the first step (6 GB): a unit actor dies, and every other rank would wait on its
  // collectives forever unless the trainer, which monitors every actor, fails the step. The
  // process must end with an error: `timeout` would exit 124 (137 after its KILL).
  for (const char* limit_kb : {"3000000", "6000000"}) {
    INFO("ulimit -v " << limit_kb);
    const fs::path run = tmp.path / (std::string("run") + limit_kb);
    std::string command = std::string("ulimit -v ") + limit_kb + "; ATOLL_SKIP_MEMORY_CHECK=1 timeout -k 10 120 " +
                          shell_quote(app_binary("atoll-train").string()) + " " +
                          shell_quote(source_path("configs/beam-tiny.yaml").string()) +
                          " --set run_dir=" + shell_quote(run.string()) +
                          " --set topology.mesh.dp_shard=256 --set train.global_batch=256 --set train.micro_batch=1" +
                          " --set train.steps=1 >" + shell_quote((tmp.path / "out.txt").string()) + " 2>" +
                          shell_quote((tmp.path / "err.txt").string());
    const int status = std::system(("bash -c " + shell_quote(command)).c_str());
    const std::string err = read_file(tmp.path / "err.txt");
    INFO(err);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);  // an error exit: not a hang (124, 137), not a crash after the message
    CHECK((err.find("building the actor runtime for 256 ranks failed") != std::string::npos ||
           err.find("stopped: std::bad_alloc") != std::string::npos || err.find("out of memory") != std::string::npos));
    // CAF's default handler would print every dying actor's exception to stdout.
    CHECK(read_file(tmp.path / "out.txt").find("unhandled exception") == std::string::npos);
  }
}
