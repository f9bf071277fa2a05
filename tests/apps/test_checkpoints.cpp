// Checkpoints end to end: resume, cross-mesh loading, corruption, HF conversion, evaluation and
// logits that Python's safetensors package reads.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>
#include <tuple>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/manifest.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "tests/apps/app_test_support.hpp"

using namespace atl::testing;
using atl::complete_checkpoints;
using atl::load_checkpoint;

namespace {

std::vector<std::string> train_args(const fs::path& run_dir, const std::string& config = "configs/beam-tiny.yaml") {
  return {source_path(config).string(), "--set", "run_dir=" + run_dir.string(), "--set", "train.log_every=100"};
}

// Appends `--set key=value` for each assignment.
void add_sets(std::vector<std::string>& args, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
}

Result must_run(const std::string& app, const std::vector<std::string>& args, const fs::path& scratch) {
  Result r = run_app(app, args, scratch);
  INFO(app << " stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  return r;
}

// Trains beam-tiny for `steps` steps into `run_dir`, saving every `every`; returns the checkpoint of
// the last step.
fs::path trained_checkpoint(const fs::path& run_dir, int steps, int every, const fs::path& scratch) {
  auto args = train_args(run_dir);
  add_sets(args, {"train.steps=" + std::to_string(steps), "checkpoint.every=" + std::to_string(every)});
  must_run("atoll-train", args, scratch);
  return run_dir / "checkpoints" / atl::checkpoint_dir_name(steps);
}

std::vector<nlohmann::json> metrics_without_timing_lines(const fs::path& file) {
  std::vector<nlohmann::json> lines;
  for (auto m : read_metrics(file)) {
    m.erase("tokens_per_s");
    m.erase("elapsed_s");
    lines.push_back(m);
  }
  return lines;
}

// run.json as a run that died before its end leaves it: not marked finished.
void unmark_finished(const fs::path& run_dir) {
  nlohmann::json run = nlohmann::json::parse(read_file(run_dir / "run.json"));
  REQUIRE(run.at("finished") == true);
  run.erase("finished");
  write_file(run_dir / "run.json", run.dump(2));
}

// metrics.jsonl holds steps 1..steps, each once, in order (no gap, no repeat).
void check_steps_once_in_order(const fs::path& metrics_file, std::size_t steps) {
  const auto metrics = read_metrics(metrics_file);
  REQUIRE(metrics.size() == steps);
  for (std::size_t i = 0; i < metrics.size(); ++i) CHECK(metrics[i].at("step").get<std::int64_t>() == static_cast<std::int64_t>(i + 1));
}

// The Python interpreter that has the safetensors package, or "" (the caller skips).
std::string python_with_safetensors() {
  for (const std::string& python : {source_path(".venv-tools/bin/python").string(), std::string("/usr/bin/python3")}) {
    if (!fs::exists(python)) continue;
    std::string probe = shell_quote(python);
    probe.append(" -c 'import safetensors.numpy, numpy' >/dev/null 2>&1");
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

}  // namespace

TEST_CASE("apps: resume from a checkpoint reproduces the uninterrupted run, across meshes", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path a = tmp.path / "a", b = tmp.path / "b", c = tmp.path / "c";
  auto args = train_args(a);
  add_sets(args, {"train.steps=20", "checkpoint.every=10", "topology.mesh.dp_shard=4"});
  must_run("atoll-train", args, tmp.path);
  const fs::path step10 = a / "checkpoints" / "step-00000010";
  REQUIRE(fs::exists(step10 / "COMPLETE"));
  REQUIRE(fs::exists(a / "checkpoints" / "step-00000020" / "COMPLETE"));

  // Resumed on the same mesh: steps 11-20 are byte-identical lines (timing aside).
  auto resume_same = train_args(tmp.path / "same");
  add_sets(resume_same, {"train.steps=20", "topology.mesh.dp_shard=4"});
  resume_same.push_back("--resume");
  resume_same.push_back(step10.string());
  const Result rs = must_run("atoll-train", resume_same, tmp.path);
  CHECK(rs.out.find("resumed from") != std::string::npos);
  const auto full = metrics_without_timing_lines(a / "metrics.jsonl");
  const auto same = metrics_without_timing_lines(tmp.path / "same" / "metrics.jsonl");
  REQUIRE(full.size() == 20);
  REQUIRE(same.size() == 10);
  for (std::size_t i = 0; i < 10; ++i) {
    INFO("step " << i + 11);
    CHECK(same[i].dump() == full[i + 10].dump());
  }

  // Saved under dp_shard 4, resumed under dp_shard 2: the same losses bit for bit (this layout
  // reproduces the reduction tree); the gradient norm is summed over other shards, so only its
  // last bits may differ, and the bytes moved differ by design.
  auto resume_b = train_args(b);
  add_sets(resume_b, {"train.steps=20", "topology.mesh.dp_shard=2"});
  resume_b.push_back("--resume");
  resume_b.push_back(step10.string());
  must_run("atoll-train", resume_b, tmp.path);
  const auto resumed = metrics_without_timing_lines(b / "metrics.jsonl");
  REQUIRE(resumed.size() == 10);
  for (std::size_t i = 0; i < 10; ++i) {
    INFO("step " << i + 11);
    CHECK(resumed[i].at("loss").get<double>() == full[i + 10].at("loss").get<double>());
    CHECK(resumed[i].at("grad_norm").get<double>() ==
          Approx(full[i + 10].at("grad_norm").get<double>()).epsilon(1e-12));
  }

  // ...and under the reference trainer: the next step's loss agrees to 1e-6.
  auto resume_c = train_args(c);
  add_sets(resume_c, {"train.steps=11", "topology.engine=reference"});
  resume_c.push_back("--resume");
  resume_c.push_back(step10.string());
  must_run("atoll-train", resume_c, tmp.path);
  const auto reference = read_metrics(c / "metrics.jsonl");
  REQUIRE(reference.size() == 1);
  const double expect = full[10].at("loss").get<double>();
  CHECK(std::abs(reference[0].at("loss").get<double>() - expect) <= 1e-6 * std::abs(expect));

  // --resume without a value continues from the latest checkpoint of the run's checkpoint.dir.
  auto latest = train_args(a);
  add_sets(latest, {"train.steps=22", "checkpoint.every=0"});
  latest.push_back("--resume");
  const Result rl = must_run("atoll-train", latest, tmp.path);
  CHECK(rl.out.find("step-00000020") != std::string::npos);
  CHECK(read_metrics(a / "metrics.jsonl").size() == 22);
}

TEST_CASE("apps: a model override written no is saved as false, resumes and exports, as does a checkpoint of an "
          "earlier build that saved the string",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  auto args = train_args(run);
  add_sets(args, {"train.steps=2", "checkpoint.every=2", "model.norm_topk_prob=no"});
  must_run("atoll-train", args, tmp.path);
  const fs::path ckpt = run / "checkpoints" / "step-00000002";
  nlohmann::json state = nlohmann::json::parse(read_file(ckpt / "trainer_state.json"));
  CHECK(state.at("config").at("model").at("norm_topk_prob") == false);
  CHECK(nlohmann::json::parse(read_file(run / "run.json")).at("config").at("model").at("norm_topk_prob") == false);
  auto resume_and_export = [&](const std::string& tag) {
    auto resume = train_args(tmp.path / ("resumed-" + tag));
    add_sets(resume, {"train.steps=3", "model.norm_topk_prob=no"});
    resume.push_back("--resume");
    resume.push_back(ckpt.string());
    must_run("atoll-train", resume, tmp.path);
    const fs::path hf = tmp.path / ("hf-" + tag);
    must_run("atoll-convert", {"export", ckpt.string(), hf.string()}, tmp.path);
    CHECK(nlohmann::json::parse(read_file(hf / "config.json")).at("norm_topk_prob") == false);
  };
  resume_and_export("now");
  state["config"]["model"]["norm_topk_prob"] = "no";
  write_file(ckpt / "trainer_state.json", state.dump(2));
  write_file(ckpt / "COMPLETE", atl::make_manifest(ckpt, 2, "COMPLETE").dump(2));
  resume_and_export("earlier");
}

TEST_CASE("apps: --resume refuses a metrics.jsonl line that is no step's record, before it changes anything",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  const fs::path step2 = trained_checkpoint(run, 4, 2, tmp.path).parent_path() / "step-00000002";
  for (const std::string& bad : {std::string("[1, 2]"), std::string("{\"step\": \"x\"}")}) {
    INFO(bad);
    write_file(run / "metrics.jsonl", read_file(run / "metrics.jsonl") + bad + "\n");
    const std::string metrics = read_file(run / "metrics.jsonl"), run_json = read_file(run / "run.json");
    auto resume = train_args(run);
    add_sets(resume, {"train.steps=4"});
    resume.insert(resume.end(), {"--resume", step2.string()});
    const Result r = run_app("atoll-train", resume, tmp.path);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains((run / "metrics.jsonl").string() + ": line 5: expected a step's record"));
    CHECK(read_file(run / "metrics.jsonl") == metrics);
    CHECK(read_file(run / "run.json") == run_json);
    CHECK(fs::exists(run / "checkpoints" / "step-00000004" / "COMPLETE"));  // nothing set aside
    write_file(run / "metrics.jsonl", metrics.substr(0, metrics.size() - bad.size() - 1));
  }
}

TEST_CASE("apps: --resume compares a saved data section with a field of the wrong type, and names it", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path step4 = trained_checkpoint(tmp.path / "run", 4, 4, tmp.path);
  nlohmann::json state = nlohmann::json::parse(read_file(step4 / "trainer_state.json"));
  state["config"]["data"] = {{"source", "tokens:/tmp/x.u16"}, {"token_width", "x"}};  // (it threw a type_error: exit 1)
  write_file(step4 / "trainer_state.json", state.dump(2));
  write_file(step4 / "COMPLETE", atl::make_manifest(step4, 4, "COMPLETE").dump(2));
  auto resume = train_args(tmp.path / "resumed");
  add_sets(resume, {"train.steps=6"});
  resume.insert(resume.end(), {"--resume", step4.string()});
  const Result r = run_app("atoll-train", resume, tmp.path);
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains(": data.") && Catch::Contains("--resume continues the run saved in"));
}

TEST_CASE("apps: --resume into a run_dir that holds another run is refused, its records intact", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path a = tmp.path / "a", b = tmp.path / "b";
  const fs::path step2 = trained_checkpoint(a, 2, 2, tmp.path);
  auto other = train_args(b);
  add_sets(other, {"train.steps=3", "train.seed=99"});
  must_run("atoll-train", other, tmp.path);
  const std::string metrics = read_file(b / "metrics.jsonl"), run_json = read_file(b / "run.json");
  auto resume = train_args(b);  // run a's checkpoint, run b's folder
  add_sets(resume, {"train.steps=4", "checkpoint.dir=" + (a / "checkpoints").string()});
  resume.insert(resume.end(), {"--resume", step2.string()});
  const Result r = run_app("atoll-train", resume, tmp.path);
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("run_dir: '" + b.string() + "' holds another run (its run.json has train.seed 99, "
                                    "this run 1234)"));
  CHECK(read_file(b / "metrics.jsonl") == metrics);
  CHECK(read_file(b / "run.json") == run_json);
  // --overwrite does not act on a resume of checkpoint.dir's own checkpoints: refused alike (it
  // spliced run a's steps onto run b's records).
  resume.push_back("--overwrite");
  const Result overwrite = run_app("atoll-train", resume, tmp.path);
  INFO(overwrite.err);
  CHECK(overwrite.exit_code == 2);
  CHECK_THAT(overwrite.err, Catch::Contains("holds another run (its run.json has train.seed 99"));
  CHECK(read_file(b / "metrics.jsonl") == metrics);
  CHECK(read_file(b / "run.json") == run_json);
  // Another data stream is another run, named by its key.
  const fs::path c = tmp.path / "c";
  auto other_data = train_args(c);
  add_sets(other_data, {"train.steps=3", "data.synthetic_branching=3"});
  must_run("atoll-train", other_data, tmp.path);
  auto into_c = train_args(c);
  add_sets(into_c, {"train.steps=4", "checkpoint.dir=" + (a / "checkpoints").string()});
  into_c.insert(into_c.end(), {"--resume", step2.string()});
  const Result data = run_app("atoll-train", into_c, tmp.path);
  INFO(data.err);
  CHECK(data.exit_code == 2);
  CHECK_THAT(data.err, Catch::Contains("holds another run (its run.json has data.synthetic_branching 3, this run"));
  // Into its own run_dir it continues.
  auto own = train_args(a);
  add_sets(own, {"train.steps=4"});
  own.insert(own.end(), {"--resume", step2.string()});
  must_run("atoll-train", own, tmp.path);
  CHECK(read_metrics(a / "metrics.jsonl").size() == 4);
}

TEST_CASE("apps: a damaged checkpoint is refused with the file and the fault named", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  const fs::path good = trained_checkpoint(run, 4, 2, tmp.path);
  const fs::path bad = tmp.path / "bad" / "step-00000004";
  fs::create_directories(bad.parent_path());
  fs::copy(good, bad);
  fs::resize_file(bad / "model.safetensors", fs::file_size(bad / "model.safetensors") / 2);
  auto resume = train_args(tmp.path / "r");
  resume.push_back("--set");
  resume.push_back("train.steps=6");
  resume.push_back("--resume");
  resume.push_back(bad.string());
  const Result r = run_app("atoll-train", resume, tmp.path);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("model.safetensors") != std::string::npos);
  CHECK(r.err.find("the manifest says") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "r" / "metrics.jsonl"));
  // The checkpoint of another model is a mismatch, named as such.
  auto other = train_args(tmp.path / "o");
  add_sets(other, {"train.steps=6", "model.preset=beam-tiny-dense"});
  other.push_back("--resume");
  other.push_back(good.string());
  const Result ro = run_app("atoll-train", other, tmp.path);
  CHECK(ro.exit_code == 2);
  CHECK(ro.err.find("step-00000004") != std::string::npos);

  // A folder that is no checkpoint, named as one to atoll-train --resume (with train_args' extra
  // settings), atoll-eval and atoll-convert export: exit 2, saying what the folder is.
  int tries = 0;
  auto each_tool_refuses = [&](const fs::path& dir, std::initializer_list<std::string> train_sets,
                               const std::vector<std::string>& said) {
    const std::string n = std::to_string(tries++);
    auto resume = train_args(tries == 1 ? run : tmp.path / ("r" + n));
    add_sets(resume, train_sets);
    resume.push_back("--resume");
    resume.push_back(dir.string());
    for (const auto& [app, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"atoll-train", resume},
             {"atoll-eval", {source_path("configs/beam-tiny.yaml").string(), "--checkpoint", dir.string()}},
             {"atoll-convert", {"export", dir.string(), (tmp.path / ("hf" + n)).string()}}}) {
      const Result r = run_app(app, args, tmp.path);
      INFO(app << ": " << r.err);
      CHECK(r.exit_code == 2);
      for (const auto& part : said) CHECK_THAT(r.err, Catch::Contains(part));
    }
  };
  // The checkpoints' root, named where one checkpoint belongs (atoll-train from the run's own
  // run_dir: the root is named before the run_dir checks): the one to name is given.
  const fs::path root = run / "checkpoints";
  each_tool_refuses(root, {"train.steps=6"},
                    {root.string() + ": a checkpoint root (it holds step-NNNNNNNN checkpoints), not a checkpoint: name "
                                     "one of its step folders, the latest complete one is " + good.string()});
  // An HF folder (an export): the import to run first is given.
  const fs::path hf = tmp.path / "exported";
  REQUIRE(run_app("atoll-convert", {"export", good.string(), hf.string()}, tmp.path).exit_code == 0);
  each_tool_refuses(hf, {}, {hf.string() + ": an HF model folder", "import it first (atoll-convert import " + hf.string()});
}

TEST_CASE("apps: atoll-convert HF export -> import -> export is bitwise, atoll-eval scores both",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  auto args = train_args(run);
  add_sets(args, {"train.steps=3", "checkpoint.every=3"});
  must_run("atoll-train", args, tmp.path);
  const fs::path ckpt = run / "checkpoints" / "step-00000003";
  for (const char* dtype : {"fp32", "bf16"}) {
    INFO("dtype " << dtype);
    const fs::path hf1 = tmp.path / (std::string("hf1-") + dtype), hf2 = tmp.path / (std::string("hf2-") + dtype);
    const fs::path imported = tmp.path / (std::string("imported-") + dtype);
    must_run("atoll-convert", {"export", ckpt.string(), hf1.string(), "--dtype", dtype}, tmp.path);
    CHECK(fs::exists(hf1 / "config.json"));
    must_run("atoll-convert",
             {"import", hf1.string(), imported.string(), "--config", source_path("configs/beam-tiny.yaml").string()},
             tmp.path);
    must_run("atoll-convert", {"export", (imported / "step-00000000").string(), hf2.string(), "--dtype", dtype},
             tmp.path);
    CHECK(read_file(hf1 / "model.safetensors") == read_file(hf2 / "model.safetensors"));
    const auto hf = atl::read_safetensors(hf1 / "model.safetensors").tensors;
    CHECK(hf.at("model.layers.0.mlp.gate.weight").dtype() == atl::DType::f32);  // islands never below fp32
    CHECK(hf.at("model.layers.0.mlp.experts.0.gate_proj.weight").dtype() ==
          (std::string(dtype) == "bf16" ? atl::DType::bf16 : atl::DType::f32));
  }
  const std::string config = source_path("configs/beam-tiny.yaml").string();
  const Result e1 = must_run("atoll-eval", {config, "--checkpoint", ckpt.string(), "--batches", "2"}, tmp.path);
  const Result e2 = must_run(
      "atoll-eval", {config, "--checkpoint", (tmp.path / "imported-fp32" / "step-00000000").string(), "--batches", "2"},
      tmp.path);
  CHECK(e1.out.rfind("eval loss=", 0) == 0);
  CHECK(e1.out == e2.out);  // the fp32 round trip changed no weight
  // A directory that is not a checkpoint: exit 2 and the path named.
  const Result bad = run_app("atoll-eval", {config, "--checkpoint", tmp.path.string()}, tmp.path);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find(tmp.path.string()) != std::string::npos);
  // A data file that is not there is bad input too: exit 2, the file named.
  const Result no_data = run_app(
      "atoll-eval", {config, "--checkpoint", ckpt.string(), "--set", "data.source=text:" + (tmp.path / "none.txt").string()},
      tmp.path);
  CHECK(no_data.exit_code == 2);
  CHECK(no_data.err.find("none.txt") != std::string::npos);
  // A short file read once: scored until it is used up, not over batches of padding after it.
  write_file(tmp.path / "short.txt", "A short text of a few dozen bytes.\n");
  const Result once = must_run("atoll-eval", {config, "--checkpoint", ckpt.string(), "--batches", "1000000000000",
                                              "--set", "data.source=text:" + (tmp.path / "short.txt").string(),
                                              "--set", "data.loop=false"},
                               tmp.path);
  CHECK_THAT(once.out, Catch::EndsWith("targets=34 batches=1\n"));
  // Counts past int64 are refused, not read as the largest int64 (CLI11 2.1 clamps them).
  for (const char* count : {"99999999999999999999", "18446744073709551615", "0", "-3", "2x"}) {
    INFO(count);
    const Result e = run_app("atoll-eval", {config, "--checkpoint", ckpt.string(), "--batches", count}, tmp.path);
    CHECK(e.exit_code == 2);
    CHECK_THAT(e.err, Catch::Contains("--batches: expected a positive count (an integer in [1, 9223372036854775807])"));
    const Result x = run_app("atoll-convert", {"export", ckpt.string(), (tmp.path / "hf-big").string(),
                                               "--max-shard-bytes", count}, tmp.path);
    CHECK(x.exit_code == 2);
    CHECK_THAT(x.err, Catch::Contains("--max-shard-bytes: expected a positive byte count"));
  }
  CHECK_FALSE(fs::exists(tmp.path / "hf-big"));

  // Export to "out/" (a trailing slash) writes out; an import into a root with training
  // checkpoints adds step 0 and leaves them, and never replaces a step 0.
  must_run("atoll-convert", {"export", ckpt.string(), (tmp.path / "hf-slash").string() + "/"}, tmp.path);
  CHECK(fs::exists(tmp.path / "hf-slash" / "model.safetensors"));
  const fs::path root = run / "checkpoints";
  must_run("atoll-convert", {"import", (tmp.path / "hf-slash").string(), root.string()}, tmp.path);
  CHECK(complete_checkpoints(root) == std::vector<fs::path>{root / "step-00000000", ckpt});
  const Result again = run_app("atoll-convert", {"import", (tmp.path / "hf-slash").string(), root.string()}, tmp.path);
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.err, Catch::Contains((root / "step-00000000").string() + ": already exists"));
  CHECK(complete_checkpoints(root).size() == 2);
  // An output root that is a file: exit 2, named.
  write_file(tmp.path / "a-file", "x");
  const Result into_file =
      run_app("atoll-convert", {"import", (tmp.path / "hf-slash").string(), (tmp.path / "a-file").string()}, tmp.path);
  CHECK(into_file.exit_code == 2);
  CHECK_THAT(into_file.err, Catch::Contains((tmp.path / "a-file").string() + ": exists and is not a directory"));
  // An export under that file, and an import into a root this user may not write: exit 2, named
  // by the path given (not by the temporary).
  const Result under_file =
      run_app("atoll-convert", {"export", ckpt.string(), (tmp.path / "a-file" / "hf").string()}, tmp.path);
  CHECK(under_file.exit_code == 2);
  CHECK_THAT(under_file.err, Catch::Contains((tmp.path / "a-file" / "hf").string() + ": cannot create it: Not a directory"));
  if (::geteuid() == 0 && std::system("command -v setpriv >/dev/null") == 0) {  // as another user (root writes anywhere)
    const fs::path locked = tmp.path / "locked";
    fs::create_directories(locked);
    fs::permissions(tmp.path, fs::perms::others_read | fs::perms::others_exec, fs::perm_options::add);
    fs::permissions(locked, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
    // The binary runs from a copy here: the build tree may be where the other user cannot go (a
    // clone under /root, mode 700).
    const fs::path convert = tmp.path / "atoll-convert";
    fs::copy_file(app_binary("atoll-convert"), convert);
    fs::permissions(convert, fs::perms::others_read | fs::perms::others_exec, fs::perm_options::add);
    const Result refused = run_shell("setpriv --reuid=65534 --regid=65534 --clear-groups " +
                                         shell_quote(convert.string()) + " import " +
                                         shell_quote((tmp.path / "hf-slash").string()) + " " + shell_quote(locked.string()),
                                     tmp.path / "locked-out");
    INFO(refused.err);
    CHECK(refused.exit_code == 2);
    CHECK_THAT(refused.err, Catch::Contains((locked / "step-00000000").string() + ": cannot create it: Permission denied"));
  } else {
    WARN("the import into an unwritable root was not tried: it needs root and setpriv");
  }

  // An import is weights to start from, not a run: a bare --resume does not take it, and a
  // --resume of it is a fresh start (the run in run_dir is kept unless --overwrite).
  const fs::path imported = tmp.path / "imported-fp32";
  auto bare = train_args(run);
  add_sets(bare, {("checkpoint.dir=" + imported.string()).c_str()});
  bare.push_back("--resume");
  const Result no_run = run_app("atoll-train", bare, tmp.path);
  CHECK(no_run.exit_code == 2);
  CHECK_THAT(no_run.err, Catch::Contains("--resume found no complete checkpoint"));
  const std::string metrics = read_file(run / "metrics.jsonl");
  auto from_import = train_args(run);
  from_import.push_back("--resume");
  from_import.push_back((imported / "step-00000000").string());
  const Result kept = run_app("atoll-train", from_import, tmp.path);
  CHECK(kept.exit_code == 2);
  CHECK_THAT(kept.err, Catch::Contains("already holds a run"));
  CHECK(read_file(run / "metrics.jsonl") == metrics);
}

namespace {

// Two rows of 24 tokens: three documents in the first (9, 7 and 8 tokens), and in the second a
// document that began in an earlier row (positions from 5), padding at its end. Invalid tokens
// inside documents too (row 0 at 3 and 11, row 1 at 6 and 7): they are no keys and their conv
// inputs are zero (MODELS.md §10.1.4, §10.2.3), which the valid tokens' logits show. (Their own
// logits are not compared, so whether they are dispatched to experts, §10.1.8, is not seen here.)
constexpr std::int64_t kPackedRowLength = 24;
void write_packed_rows(const fs::path& file) {
  constexpr std::int64_t S = kPackedRowLength;
  atl::Tensor ids = atl::Tensor::zeros({2, S}, atl::DType::i64), pos = atl::Tensor::zeros({2, S}, atl::DType::i64);
  atl::Tensor valid = atl::Tensor::zeros({2, S}, atl::DType::boolean);
  for (std::int64_t t = 0; t < 2 * S; ++t) {
    const std::int64_t i = t % S;
    ids.data<std::int64_t>()[t] = (t * 37 + 11) % 250;
    pos.data<std::int64_t>()[t] = t < S ? (i < 9 ? i : i < 16 ? i - 9 : i - 16) : i + 5;
    valid.data<bool>()[t] = t < S ? i != 3 && i != 11 : i < 20 && i != 6 && i != 7;
  }
  atl::TensorMap rows;
  rows.insert("input_ids", ids);
  rows.insert("positions", pos);
  rows.insert("valid", valid);
  atl::write_safetensors(file, rows);
}

}  // namespace

TEST_CASE("apps: each family's fp32 logits equal an independent float64 NumPy reference, through the HF export",
          "[apps][checkpoint][python]") {
  // tests/python/atoll_reference holds one forward per family written from MODELS.md, not from
  // atoll's code. The weights are trained a little, then moved away from their init (perturb_hf.py)
  // so that biases, queries, gates and clip scales still at their init cannot agree by luck.
  const std::string python = python_with_safetensors();
  if (python.empty()) {
    const std::string why = "no interpreter with numpy and safetensors (scripts/setup.sh makes .venv-tools)";
    if (std::getenv("ATOLL_REQUIRE_PYTHON_TESTS")) FAIL("ATOLL_REQUIRE_PYTHON_TESTS is set, but " << why);
    WARN("skipped: " << why);
    return;
  }
  // OPENBLAS_CORETYPE picks the kernel of atoll's OpenBLAS anchor (bench/, TOOLCHAIN pitfall 6); NumPy's
  // bundled OpenBLAS would obey it too, and SkylakeX on a CPU without AVX-512 dies of SIGILL.
  const std::string script = "env -u OPENBLAS_CORETYPE " + shell_quote(python) + " " +
                             shell_quote(source_path("tests/python").string());
  // Each preset, and a variant that turns on what the preset leaves off. Every run has an eps far
  // from the default: a norm that ignores rms_norm_eps (MODELS.md §10.1.2) shows.
  struct Variant {
    const char* config;
    std::vector<std::string> model;
  };
  const std::string eps = "model.rms_norm_eps=0.01";
  for (const Variant& v : std::vector<Variant>{
           {"configs/beam-tiny.yaml", {eps}},
           // (SSMax at base 4 moves the logits far more than at the preset's 2048.)
           {"configs/beam-tiny.yaml", {eps, "model.n_shared_experts=1", "model.norm_topk_prob=false",
                                       "model.ssmax_base=4"}},
           // The dense preset; top-1 routing with the raw sigmoid score as the weight, one group.
           {"configs/beam-tiny.yaml", {eps, "model.preset=beam-tiny-dense"}},
           {"configs/beam-tiny.yaml", {eps, "model.num_experts_per_tok=1", "model.norm_topk_prob_top1=false",
                                       "model.n_group=1", "model.topk_group=1"}},
           {"configs/flint-tiny.yaml", {eps}},
           {"configs/flint-tiny.yaml", {eps, "model.norm_topk_prob=true"}},
           {"configs/inkling2-tiny.yaml", {eps}},
           {"configs/inkling2-tiny.yaml",  // a full layer 0, and every optional attention feature
            {eps, "model.local_layer_ids=[1, 2]", "model.use_attention_gate=true",
             "model.use_value_norm_no_gamma=true", "model.log_scaling_n_floor=2"}},
           // Six layers (a full layer inside an AttnRes block), and grouped expert selection.
           {"configs/inkling2-tiny.yaml", {eps, "model.preset=inkling2-tiny-deep"}},
           {"configs/inkling2-tiny.yaml", {eps, "model.n_group=2", "model.topk_group=1"}}}) {
    const std::string config = v.config;
    INFO(config << " " << Catch::Detail::stringify(v.model));
    TempDir tmp;
    auto args = train_args(tmp.path / "run", config);
    add_sets(args, {"precision=fp32", "train.steps=30", "checkpoint.every=30"});
    add_sets(args, v.model);
    must_run("atoll-train", args, tmp.path);
    const fs::path trained = tmp.path / "run" / "checkpoints" / "step-00000030";
    const fs::path hf = tmp.path / "hf", moved = tmp.path / "moved", root = tmp.path / "imported";
    must_run("atoll-convert", {"export", trained.string(), hf.string()}, tmp.path);
    const Result perturbed = run_shell(script + "/perturb_hf.py " + shell_quote(hf.string()) + " " +
                                           shell_quote(moved.string()) + " 7",
                                       tmp.path / "perturb");
    INFO(perturbed.err);
    REQUIRE(perturbed.exit_code == 0);
    must_run("atoll-convert", {"import", moved.string(), root.string()}, tmp.path);
    write_packed_rows(tmp.path / "rows.safetensors");
    std::vector<std::string> eval{source_path(config).string(), "--set", "precision=fp32",
                                  "--checkpoint", (root / "step-00000000").string(), "--tokens",
                                  (tmp.path / "rows.safetensors").string(), "--dump-logits",
                                  (tmp.path / "logits.safetensors").string()};
    add_sets(eval, v.model);
    must_run("atoll-eval", eval, tmp.path);
    auto compare = [&](const std::string& reference_override) {
      return run_shell(script + "/reference_logits.py " + shell_quote(moved.string()) + " " +
                           shell_quote((tmp.path / "rows.safetensors").string()) + " " +
                           shell_quote((tmp.path / "logits.safetensors").string()) + " " + reference_override,
                       tmp.path / "compare");
    };
    const Result same = compare("");
    INFO(same.out << same.err);
    CHECK(same.exit_code == 0);
    CHECK_THAT(same.out, Catch::Contains("max |reference - atoll|"));
    // The comparison can fail on one subtle rule: the reference with the default eps (what a norm
    // ignoring rms_norm_eps computes) must disagree. 1: computed and disagreed, not crashed.
    const Result other = compare("rms_norm_eps=1e-6");
    INFO(other.out << other.err);
    CHECK(other.exit_code == 1);
    CHECK_THAT(other.out, Catch::Contains("max |reference - atoll|"));
  }
}

TEST_CASE("apps: atoll-eval --dump-logits writes fp32 logits that Python's safetensors reads", "[apps][checkpoint]") {
  const std::string python = python_with_safetensors();
  for (const char* config : {"configs/beam-tiny.yaml", "configs/flint-tiny.yaml", "configs/inkling2-tiny.yaml"}) {
    REQUIRE(fs::exists(source_path(config)));
    INFO(config);
    TempDir tmp;
    const fs::path run = tmp.path / "run";
    auto args = train_args(run, config);
    add_sets(args, {"train.steps=2", "checkpoint.every=2"});
    must_run("atoll-train", args, tmp.path);
    write_packed_rows(tmp.path / "tokens.safetensors");
    const fs::path logits = tmp.path / "logits.safetensors";
    must_run("atoll-eval",
             {source_path(config).string(), "--checkpoint", (run / "checkpoints" / "step-00000002").string(),
              "--tokens", (tmp.path / "tokens.safetensors").string(), "--dump-logits", logits.string()},
             tmp.path);
    const auto read_back = atl::read_safetensors(logits).tensors;
    REQUIRE(read_back.at("logits").shape() == atl::Shape{2, kPackedRowLength, 256});
    // An output that would replace an input is refused, the input intact.
    const fs::path step2 = run / "checkpoints" / "step-00000002";
    const std::string model_file = read_file(step2 / "model.safetensors"),
                      tokens_file = read_file(tmp.path / "tokens.safetensors");
    for (const fs::path& input : {step2 / "model.safetensors", tmp.path / "tokens.safetensors"}) {
      const Result r = run_app("atoll-eval", {source_path(config).string(), "--checkpoint", step2.string(), "--tokens",
                                              (tmp.path / "tokens.safetensors").string(), "--dump-logits", input.string()},
                               tmp.path);
      INFO(r.err);
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.err, Catch::Contains("--dump-logits: '" + input.string() + "' is"));
    }
    CHECK(read_file(step2 / "model.safetensors") == model_file);
    CHECK(read_file(tmp.path / "tokens.safetensors") == tokens_file);
    {  // the config itself (a copy: a failure must not touch the source tree)
      const fs::path copy = tmp.path / "config.yaml";
      fs::copy_file(source_path(config), copy);
      const std::string text = read_file(copy);
      const Result r = run_app("atoll-eval", {copy.string(), "--checkpoint", step2.string(), "--tokens",
                                              (tmp.path / "tokens.safetensors").string(), "--dump-logits", copy.string()},
                               tmp.path);
      INFO(r.err);
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.err, Catch::Contains("--dump-logits: '" + copy.string() + "' is the config file"));
      CHECK(read_file(copy) == text);
    }
    {  // the config's data file and its run's records; a pipe (renamed over, it would become a file)
      const fs::path corpus = tmp.path / "corpus.txt", pipe = tmp.path / "pipe";
      write_file(corpus, "some text to train on\n");
      REQUIRE(::mkfifo(pipe.c_str(), 0600) == 0);
      const std::vector<std::pair<fs::path, std::string>> outputs = {
          {corpus, "is the data file (data.source)"},
          {run / "metrics.jsonl", "is the run's metrics.jsonl"},
          {pipe, "exists and is not a regular file"}};
      for (const auto& [output, why] : outputs) {
        const std::string before = output == pipe ? "" : read_file(output);
        const Result r = run_app("atoll-eval", {source_path(config).string(), "--checkpoint", step2.string(), "--set",
                                                "data.source=text:" + corpus.string(), "--set", "run_dir=" + run.string(),
                                                "--tokens", (tmp.path / "tokens.safetensors").string(), "--dump-logits",
                                                output.string()},
                                 tmp.path);
        INFO(r.err);
        CHECK(r.exit_code == 2);
        CHECK_THAT(r.err, Catch::Contains("--dump-logits: '" + output.string() + "' " + why));
        if (output == pipe) {
          CHECK(fs::is_fifo(pipe));
        } else {
          CHECK(read_file(output) == before);
        }
      }
    }
    // The usable vocabulary (250) is finite, the padded columns -inf: here, and below in Python.
    const float* z = read_back.at("logits").data<float>();
    for (std::int64_t i = 0; i < 2 * kPackedRowLength * 256; ++i) {
      const bool padded = i % 256 >= 250;
      if (padded ? !(std::isinf(z[i]) && z[i] < 0) : !std::isfinite(z[i])) FAIL("logit " << i << " is " << z[i]);
    }
    if (python.empty()) {
      const std::string why = "no interpreter with the safetensors package (scripts/setup.sh makes .venv-tools)";
      if (std::getenv("ATOLL_REQUIRE_PYTHON_TESTS")) FAIL("ATOLL_REQUIRE_PYTHON_TESTS is set, but " << why);
      WARN("skipped the Python check: " << why);
      continue;
    }
    const fs::path script = tmp.path / "check.py";
    write_file(script,
               "import sys, numpy as np\n"
               "from safetensors.numpy import load_file\n"
               "z = load_file(sys.argv[1])['logits']\n"
               "assert z.dtype == np.float32 and z.shape == (2, " + std::to_string(kPackedRowLength) +
                   ", 256), (z.dtype, z.shape)\n"
               "assert np.isfinite(z[:, :, :250]).all()\n"
               "assert np.isneginf(z[:, :, 250:]).all()\n"
               "print('ok', float(np.abs(z[:, :, :250]).max()))\n");
    const std::string command = "'" + python + "' '" + script.string() + "' '" + logits.string() + "' > '" +
                                (tmp.path / "py.txt").string() + "' 2>&1";
    const int status = std::system(command.c_str());
    INFO("python: " << read_file(tmp.path / "py.txt"));
    CHECK(status == 0);
    CHECK(read_file(tmp.path / "py.txt").rfind("ok", 0) == 0);
  }
}

TEST_CASE("apps: a run killed mid-way resumes with its whole metrics history", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  std::string command = shell_quote(app_binary("atoll-train").string());
  for (const auto& a : train_args(run)) command.append(" ").append(shell_quote(a));
  command.append(" --set train.steps=100000 --set checkpoint.every=3 >/dev/null 2>&1 & echo $! > ")
      .append(shell_quote((tmp.path / "pid").string()));
  REQUIRE(std::system(command.c_str()) == 0);
  std::string pid = read_file(tmp.path / "pid");
  pid.erase(pid.find_last_not_of(" \n") + 1);
  // Wait (bounded) for the second checkpoint, then kill the run without warning.
  const fs::path second = run / "checkpoints" / "step-00000006" / "COMPLETE";
  for (int i = 0; i < 6000 && !fs::exists(second); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::string kill = "kill -9 ";
  kill.append(pid).append(" 2>/dev/null; sleep 0.2");
  REQUIRE(std::system(kill.c_str()) == 0);
  REQUIRE(fs::exists(second));
  const std::size_t lines_before = read_metrics(run / "metrics.jsonl").size();
  CHECK(lines_before >= 6);  // every finished step was on disk when the run died

  // Six steps past the latest complete checkpoint (a fast machine may have saved more than two).
  const auto latest = atl::latest_checkpoint(run / "checkpoints");
  REQUIRE(latest.has_value());
  const std::int64_t steps = std::stoll(latest->filename().string().substr(std::string("step-").size())) + 6;
  auto resume = train_args(run);
  add_sets(resume, {"train.steps=" + std::to_string(steps), "checkpoint.every=3"});
  resume.push_back("--resume");
  must_run("atoll-train", resume, tmp.path);
  check_steps_once_in_order(run / "metrics.jsonl", static_cast<std::size_t>(steps));
}

TEST_CASE("apps: resuming from an earlier step sets the later checkpoints and their metrics lines aside first",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run", ck = run / "checkpoints";
  auto first = train_args(run);
  add_sets(first, {"train.steps=8", "checkpoint.every=2", "checkpoint.keep=0"});
  must_run("atoll-train", first, tmp.path);
  const auto first_lines = read_metrics(run / "metrics.jsonl");
  REQUIRE(first_lines.size() == 8);

  auto from_step4 = train_args(run);
  add_sets(from_step4, {"train.steps=6"});  // saves nothing (checkpoint.every 0)
  from_step4.push_back("--resume");
  from_step4.push_back((ck / "step-00000004").string());
  const Result r = must_run("atoll-train", from_step4, tmp.path);
  const auto moved = r.out.find("moved 2 later checkpoint(s), step-00000006 to step-00000008, and their metrics lines, to " +
                                (ck / "superseded-at-step-00000004-").string());
  const auto first_step = r.out.find("step     5/6");
  REQUIRE(moved != std::string::npos);
  REQUIRE(first_step != std::string::npos);
  CHECK(moved < first_step);  // before the first step: a crash later cannot leave them for --resume
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(ck)) {
    if (e.path().filename().string().rfind("superseded-", 0) == 0) aside.push_back(e.path());
  }
  REQUIRE(aside.size() == 1);
  // Nothing is lost: the checkpoints load, and the lines after step 4 are the first run's.
  CHECK(load_checkpoint(aside[0] / "step-00000008").step == 8);
  CHECK(fs::exists(aside[0] / "step-00000006" / "COMPLETE"));
  const auto cut = read_metrics(aside[0] / "metrics.jsonl");
  REQUIRE(cut.size() == 4);
  for (std::size_t i = 0; i < cut.size(); ++i) CHECK(cut[i] == first_lines[i + 4]);
  CHECK(complete_checkpoints(ck) == std::vector<fs::path>{ck / "step-00000002", ck / "step-00000004"});
  check_steps_once_in_order(run / "metrics.jsonl", 6);

  // Back to the set-aside timeline in this run_dir: refused, it would mix the two (a checkpoint
  // outside checkpoint.dir starts a run of its own, in an empty run_dir).
  auto back = train_args(run);
  add_sets(back, {"train.steps=10", "checkpoint.every=2"});
  back.push_back("--resume");
  back.push_back((aside[0] / "step-00000008").string());
  const Result mixed = run_app("atoll-train", back, tmp.path);
  CHECK(mixed.exit_code == 2);
  CHECK_THAT(mixed.err, Catch::Contains("is not one of checkpoint.dir's checkpoints"));
  check_steps_once_in_order(run / "metrics.jsonl", 6);

  // A bare --resume continues from step 4 (the latest left): every step once, in order, and the
  // changed train.steps is named (the schedule's end moved).
  auto again = train_args(run);
  add_sets(again, {"train.steps=9", "checkpoint.every=3"});
  again.push_back("--resume");
  const Result resumed = must_run("atoll-train", again, tmp.path);
  CHECK_THAT(resumed.out, Catch::Contains("start: resumed from " + (ck / "step-00000004").string()));
  CHECK_THAT(resumed.out, Catch::Contains("note: settings differ from the checkpoint's run: train.steps 8 -> 9"));
  check_steps_once_in_order(run / "metrics.jsonl", 9);
}

TEST_CASE("apps: a fresh run refuses a checkpoint.dir that holds another run's checkpoints, --overwrite removes them",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path ck = tmp.path / "ck";
  auto first = train_args(tmp.path / "a");
  add_sets(first, {"train.steps=4", "checkpoint.every=2", ("checkpoint.dir=" + ck.string()).c_str()});
  must_run("atoll-train", first, tmp.path);
  REQUIRE(complete_checkpoints(ck).size() == 2);

  auto second = train_args(tmp.path / "b");
  add_sets(second, {"train.steps=3", "checkpoint.every=3", ("checkpoint.dir=" + ck.string()).c_str()});
  const Result refused = run_app("atoll-train", second, tmp.path);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("checkpoint.dir: '" + ck.string() +
                                          "' holds checkpoints of an earlier run (up to step-00000004)"));
  CHECK(complete_checkpoints(ck).size() == 2);
  CHECK_FALSE(fs::exists(tmp.path / "b"));

  // --overwrite never removes the weights the run starts from.
  auto from_own = second;
  add_sets(from_own, {("checkpoint.load=" + (ck / "step-00000002").string()).c_str()});
  from_own.push_back("--overwrite");
  const Result load_refused = run_app("atoll-train", from_own, tmp.path);
  CHECK(load_refused.exit_code == 2);
  CHECK_THAT(load_refused.err, Catch::Contains("checkpoint.load: "));
  CHECK(complete_checkpoints(ck).size() == 2);

  second.push_back("--overwrite");
  const Result replaced = must_run("atoll-train", second, tmp.path);
  CHECK_THAT(replaced.out, Catch::Contains("removed " + (ck / "step-00000004").string()));
  CHECK(complete_checkpoints(ck) == std::vector<fs::path>{ck / "step-00000003"});
}

TEST_CASE("apps: --resume-if-any with nothing saved starts again only the run in run_dir, never another",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  auto args = train_args(run);
  add_sets(args, {"train.steps=3"});
  args.push_back("--resume-if-any");
  must_run("atoll-train", args, tmp.path);
  const std::string metrics = metrics_without_timing(run / "metrics.jsonl");
  // Finished (run.json says so), nothing saved: a restart has nothing to do.
  const Result done = must_run("atoll-train", args, tmp.path);
  CHECK_THAT(done.out, Catch::Contains("nothing to do: " + (run / "run.json").string() + " records this run as finished"));
  // The same job restarted before its end (no checkpoint yet; a crash leaves run.json unmarked):
  // it starts again and writes the same steps.
  unmark_finished(run);
  must_run("atoll-train", args, tmp.path);
  CHECK(metrics_without_timing(run / "metrics.jsonl") == metrics);
  // The same config read from another file (a copy, another directory): the same run.
  fs::copy_file(args[0], tmp.path / "copy.yaml");
  auto copied = args;
  copied[0] = (tmp.path / "copy.yaml").string();
  unmark_finished(run);
  must_run("atoll-train", copied, tmp.path);
  CHECK(metrics_without_timing(run / "metrics.jsonl") == metrics);
  // Another config is another run: kept, unless --overwrite.
  auto other = args;
  add_sets(other, {"train.lr=1.0e-3"});
  const Result refused = run_app("atoll-train", other, tmp.path);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("already holds a run") && Catch::Contains("train.lr differs"));
  CHECK(metrics_without_timing(run / "metrics.jsonl") == metrics);

  // A finished run restarted with --resume-if-any: nothing to do, exit 0, nothing changed.
  auto saving = args;
  add_sets(saving, {"checkpoint.every=3"});
  saving.push_back("--overwrite");
  must_run("atoll-train", saving, tmp.path);
  const std::string finished = read_file(run / "metrics.jsonl");
  const Result again = must_run("atoll-train", saving, tmp.path);
  CHECK_THAT(again.out, Catch::Contains("nothing to do: the latest checkpoint") &&
                            Catch::Contains("is at train.steps (3)"));
  CHECK(read_file(run / "metrics.jsonl") == finished);
}

TEST_CASE("apps: --resume-if-any of a run begun from another run's checkpoint, with nothing saved, begins there again",
          "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path a = tmp.path / "a", b = tmp.path / "b", from = a / "checkpoints" / "step-00000004";
  auto first = train_args(a);
  add_sets(first, {"train.steps=6", "checkpoint.every=2"});
  must_run("atoll-train", first, tmp.path);
  const auto a_lines = read_metrics(a / "metrics.jsonl");
  REQUIRE(a_lines.size() == 6);

  auto begun = train_args(b);
  add_sets(begun, {"train.steps=6"});  // saves nothing (checkpoint.every 0): a job that fails before its first save
  begun.push_back("--resume");
  begun.push_back(from.string());
  must_run("atoll-train", begun, tmp.path);
  CHECK(nlohmann::json::parse(read_file(b / "run.json")).at("began_from") == from.string());
  const std::string metrics = metrics_without_timing(b / "metrics.jsonl");

  // Restarted as a launcher restarts (--resume-if-any) after a failure before its end: from step 4
  // of run a again, not a fresh model.
  unmark_finished(b);
  auto restarted = train_args(b);
  add_sets(restarted, {"train.steps=6"});
  restarted.push_back("--resume-if-any");
  const Result again = must_run("atoll-train", restarted, tmp.path);
  CHECK_THAT(again.out, Catch::Contains("start: resumed from " + from.string() + " at step 4"));
  CHECK(metrics_without_timing(b / "metrics.jsonl") == metrics);
  const auto b_lines = read_metrics(b / "metrics.jsonl");
  REQUIRE(b_lines.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) CHECK(b_lines[i].at("loss") == a_lines[i + 4].at("loss"));

  // That checkpoint gone: nothing to continue from, named, and run b left as it was.
  unmark_finished(b);
  fs::rename(from, tmp.path / "moved");
  const Result lost = run_app("atoll-train", restarted, tmp.path);
  CHECK(lost.exit_code == 2);
  CHECK_THAT(lost.err, Catch::Contains((b / "run.json").string() + ": began_from") &&
                           Catch::Contains("is no longer a directory"));
  CHECK(metrics_without_timing(b / "metrics.jsonl") == metrics);
}

namespace {
// Trains beam-tiny two steps into folder/beam and returns its checkpoint's directory.
std::string beam_checkpoint_at_step_2(const fs::path& folder) {
  auto beam = train_args(folder / "beam");
  add_sets(beam, {"train.steps=2", "checkpoint.every=2"});
  must_run("atoll-train", beam, folder);
  return (folder / "beam" / "checkpoints" / "step-00000002").string();
}
}  // namespace

TEST_CASE("apps: a checkpoint of another family is refused as such by --resume, checkpoint.load and atoll-eval",
          "[apps][checkpoint]") {
  TempDir tmp;
  const std::string step2 = beam_checkpoint_at_step_2(tmp.path);
  auto resume = train_args(tmp.path / "flint", "configs/flint-tiny.yaml");
  add_sets(resume, {"train.steps=4"});
  resume.push_back("--resume");
  resume.push_back(step2);
  auto load = train_args(tmp.path / "flint", "configs/flint-tiny.yaml");
  add_sets(load, {"train.steps=4"});
  load.push_back("--set");
  load.push_back("checkpoint.load=" + step2);
  const std::vector<std::string> eval{source_path("configs/flint-tiny.yaml").string(), "--checkpoint", step2};
  for (const auto& [app, args] : {std::pair{"atoll-train", resume}, std::pair{"atoll-train", load}, std::pair{"atoll-eval", eval}}) {
    const Result r = run_app(app, args, tmp.path);
    INFO(app << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(step2 + ": holds a beam model (config.json model_type), the config describes flint"));
  }
  CHECK_FALSE(fs::exists(tmp.path / "flint"));
}

TEST_CASE("apps: nothing writes inside a saved checkpoint, which would then fail to load", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path ckpt = trained_checkpoint(tmp.path / "run", 2, 2, tmp.path);
  const fs::path hf = tmp.path / "hf";
  must_run("atoll-convert", {"export", ckpt.string(), hf.string()}, tmp.path);
  const std::string config = source_path("configs/beam-tiny.yaml").string();
  auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ckpt)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = entries();
  struct Attempt {
    const char* what;
    std::string binary;
    std::vector<std::string> args;
  };
  auto train_into = [&](const std::string& key, const fs::path& where) {
    auto a = train_args(tmp.path / "other");
    add_sets(a, {"train.steps=1", "checkpoint.every=1", key + "=" + where.string()});
    return a;
  };
  auto traced = train_args(tmp.path / "traced");
  add_sets(traced, {"train.steps=1"});
  traced.insert(traced.end(), {"--trace", (ckpt / "trace.json").string()});
  const std::vector<Attempt> attempts = {
      {"an export into it", "atoll-convert", {"export", ckpt.string(), (ckpt / "hf").string()}},
      {"an import into it", "atoll-convert", {"import", hf.string(), ckpt.string()}},
      {"a run_dir inside it", "atoll-train", train_into("run_dir", ckpt / "sub")},
      {"a checkpoint.dir inside it", "atoll-train", train_into("checkpoint.dir", ckpt / "more")},
      {"a trace into it", "atoll-train", traced},
  };
  for (const Attempt& a : attempts) {
    INFO(a.what);
    const Result r = run_app(a.binary, a.args, tmp.path);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("the saved checkpoint " + fs::weakly_canonical(ckpt).string()) &&
                          Catch::Contains("inside"));
    CHECK(entries() == before);
  }
  must_run("atoll-eval", {config, "--checkpoint", ckpt.string(), "--batches", "1"}, tmp.path);  // still loads
}

TEST_CASE("apps: atoll-convert names a subcommand it does not have", "[apps][checkpoint]") {
  TempDir tmp;
  const Result r = run_app("atoll-convert", {"exprot", "a", "b"}, tmp.path);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("'exprot' is not a subcommand; expected export or import"));
  CHECK(run_app("atoll-convert", {"--help"}, tmp.path).exit_code == 0);
}

TEST_CASE("apps: a checkpoint.load that is no checkpoint is refused naming the config and the key",
          "[apps][checkpoint]") {
  TempDir tmp;
  auto args = train_args(tmp.path / "run");
  add_sets(args, {"train.steps=1", "checkpoint.load=" + (tmp.path / "nowhere").string()});
  const Result r = run_app("atoll-train", args, tmp.path);
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("beam-tiny.yaml: checkpoint.load: " + (tmp.path / "nowhere").string() +
                                    ": not a checkpoint directory"));
  CHECK_FALSE(fs::exists(tmp.path / "run" / "metrics.jsonl"));
}

TEST_CASE("apps: atoll-eval refuses a checkpoint under other model settings, and checkpoint.load names them",
          "[apps][checkpoint]") {
  TempDir tmp;
  const std::string step2 = beam_checkpoint_at_step_2(tmp.path);
  auto eval = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{source_path("configs/beam-tiny.yaml").string(), "--checkpoint", step2, "--batches", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_app("atoll-eval", args, tmp.path);
  };
  const Result changed = eval({"--set", "model.rope_theta=500000", "--set", "model.rms_norm_eps=0.5"});
  INFO(changed.err);
  CHECK(changed.exit_code == 2);
  CHECK_THAT(changed.err, Catch::Contains(step2 + ": the checkpoint's model (config.json) differs from the config's: "
                                                  "rms_norm_eps 1e-06 -> 0.5, rope_theta 10000.0 -> 500000.0"));
  const Result allowed = eval({"--set", "model.rope_theta=500000", "--allow-model-change"});
  CHECK(allowed.exit_code == 0);
  CHECK_THAT(allowed.out, Catch::Contains("eval loss="));
  CHECK(eval({"--set", "model.init_std=0.05"}).exit_code == 0);  // the init scale changes nothing loaded

  auto load = train_args(tmp.path / "tuned");
  add_sets(load, {"train.steps=1", "model.sliding_window=4", "checkpoint.load=" + step2});
  const Result tuned = run_app("atoll-train", load, tmp.path);
  INFO(tuned.err);
  CHECK(tuned.exit_code == 0);
  CHECK_THAT(tuned.out, Catch::Contains("note: the model differs from that of the checkpoint it starts from (its "
                                        "config.json): sliding_window 8 -> 4\n"));
}

TEST_CASE("apps: --resume refuses a config that changes the run's model, seed or data", "[apps][checkpoint]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  auto args = train_args(run);
  add_sets(args, {"train.steps=2", "checkpoint.every=2"});
  must_run("atoll-train", args, tmp.path);
  // (A model key the saved run left at its preset's value shows that value.)
  for (const auto& [change, key, values] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"train.seed=99", "train.seed", "which had 1234; this config has 99"},
           {"data.synthetic_branching=3", "data.synthetic_branching", "; this config has 3"},
           {"model.hidden_size=32", "model.hidden_size", "which had 64 (the preset's); this config has 32"},
           {"model.init_std=0.03", "model.init_std", "which had the preset's value; this config has 0.03"},
           {"model.router_weights_fp32=true", "model.router_weights_fp32", "; this config has true"}}) {
    auto resume = train_args(tmp.path / "other");
    for (const std::string& s : {std::string("train.steps=4"), change}) {
      resume.push_back("--set");
      resume.push_back(s);
    }
    resume.push_back("--resume");
    resume.push_back((run / "checkpoints" / "step-00000002").string());
    const Result r = run_app("atoll-train", resume, tmp.path);
    INFO(change << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(": " + key + ": --resume continues the run saved in"));
    CHECK_THAT(r.err, Catch::Contains(values));
  }
  // The same model in other words (a key set to the preset's own value) is no change: resumed.
  int n = 0;
  for (const char* same : {"model.hidden_size=64", "model.init_std=0.02"}) {
    auto resume = train_args(tmp.path / ("same" + std::to_string(n++)));
    add_sets(resume, {"train.steps=3", same});
    resume.push_back("--resume");
    resume.push_back((run / "checkpoints" / "step-00000002").string());
    INFO(same);
    const Result r = must_run("atoll-train", resume, tmp.path);
    CHECK_THAT(r.out, Catch::Contains("start: resumed from"));
  }
}

TEST_CASE("apps: expert parallelism writes the same checkpoint bytes as ep 1 and resumes across ep",
          "[apps][checkpoint][experts]") {
  TempDir tmp;
  auto read_bytes = [](const fs::path& p) { return read_file(p); };
  std::map<std::string, fs::path> runs;
  for (const char* ep : {"1", "2", "4"}) {
    const fs::path dir = tmp.path / (std::string("ep") + ep);
    auto args = train_args(dir);
    add_sets(args, {"train.steps=8", "checkpoint.every=4", "topology.mesh.dp_shard=4"});
    args.push_back("--set");
    args.push_back(std::string("topology.mesh.ep=") + ep);
    const Result r = must_run("atoll-train", args, tmp.path);
    if (std::string(ep) != "1") CHECK(r.out.find(", ep " + std::string(ep) + " (all_to_all))") != std::string::npos);
    runs[ep] = dir;
  }
  // Every ep moves the same bits: losses, and the saved masters and moments byte for byte.
  const auto one = metrics_without_timing_lines(runs["1"] / "metrics.jsonl");
  for (const char* ep : {"2", "4"}) {
    INFO("ep " << ep);
    const auto other = metrics_without_timing_lines(runs[ep] / "metrics.jsonl");
    REQUIRE(other.size() == one.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      CHECK(other[i].at("loss").get<double>() == one[i].at("loss").get<double>());
      CHECK(other[i].at("bytes_dispatch").get<std::int64_t>() > 0);
      CHECK(one[i].at("bytes_dispatch").get<std::int64_t>() == 0);
    }
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      CHECK(read_bytes(runs[ep] / "checkpoints" / "step-00000008" / file) ==
            read_bytes(runs["1"] / "checkpoints" / "step-00000008" / file));
    }
  }
  // Saved under ep 2, resumed under ep 4 (and the all_gather flow): steps 5-8 as before.
  const fs::path resumed = tmp.path / "resumed";
  auto args = train_args(resumed);
  add_sets(args, {"train.steps=8", "topology.mesh.dp_shard=4", "topology.mesh.ep=4", "topology.ep_dispatch=all_gather"});
  args.push_back("--resume");
  args.push_back((runs["2"] / "checkpoints" / "step-00000004").string());
  must_run("atoll-train", args, tmp.path);
  const auto again = metrics_without_timing_lines(resumed / "metrics.jsonl");
  REQUIRE(again.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(again[i].at("loss").get<double>() == one[i + 4].at("loss").get<double>());

  // Bad meshes exit 2 naming the key: ep not dividing E (8), ep not dividing dp x cp.
  for (const auto& [dp, ep, expected] : {std::tuple{"3", "3", "expected ep to divide the number of experts"},
                                         std::tuple{"4", "3", "expected a divisor of dp_replicate x dp_shard x cp"}}) {
    auto bad = train_args(tmp.path / "bad");
    bad.push_back("--set");
    bad.push_back(std::string("topology.mesh.dp_shard=") + dp);
    bad.push_back("--set");
    bad.push_back(std::string("topology.mesh.ep=") + ep);
    const Result r = run_app("atoll-train", bad, tmp.path);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("topology.mesh.ep") != std::string::npos);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK_FALSE(fs::exists(tmp.path / "bad"));
  }
}

TEST_CASE("apps: --resume compares the data as read: the same file by another path resumes, other data is refused",
          "[apps][checkpoint]") {
  TempDir tmp;
  std::string tokens;  // 3000 uint16 ids below the usable vocabulary
  for (int i = 0; i < 3000; ++i) {
    const int id = (i * 7 + i / 13) % 250;
    tokens.push_back(static_cast<char>(id & 0xff));
    tokens.push_back(static_cast<char>(id >> 8));
  }
  write_file(tmp.path / "d.u16", tokens);
  write_file(tmp.path / "d.txt", "some text\n");
  // Runs atoll-train in tmp, where "d.u16" names the file.
  auto train_in_tmp = [&](const std::vector<std::string>& args) {
    std::string command = "cd ";
    command.append(shell_quote(tmp.path.string())).append(" && exec ").append(shell_quote(app_binary("atoll-train").string()));
    for (const auto& a : args) command.append(" ").append(shell_quote(a));
    return run_shell(command, tmp.path / "out");
  };
  auto args = train_args(tmp.path / "run");
  add_sets(args, {"train.steps=4", "checkpoint.every=2", "data.source=tokens:d.u16"});
  REQUIRE(train_in_tmp(args).exit_code == 0);
  const fs::path step2 = tmp.path / "run" / "checkpoints" / "step-00000002";
  // The same file by its absolute path, the width written out: resumed, the same losses.
  auto same = train_args(tmp.path / "same");
  add_sets(same, {"train.steps=4", "data.source=tokens:" + (tmp.path / "d.u16").string(), "data.token_width=2"});
  same.push_back("--resume");
  same.push_back(step2.string());
  must_run("atoll-train", same, tmp.path);
  const auto a = read_metrics(tmp.path / "run" / "metrics.jsonl"), b = read_metrics(tmp.path / "same" / "metrics.jsonl");
  REQUIRE(a.size() == 4);
  REQUIRE(b.size() == 2);
  for (int i = 0; i < 2; ++i) CHECK(b[i].at("loss") == a[i + 2].at("loss"));
  // Another kind of source, or other documents: refused, the key named (the source as written).
  for (const auto& [change, expected] : std::vector<std::pair<std::string, std::string>>{
           {"data.source=text:" + (tmp.path / "d.txt").string(), "data.source: --resume continues the run saved in " +
                                                                      step2.string() + ", which had \"tokens:d.u16\""},
           {"data.eos_id=3", "data.eos_id: --resume continues the run saved in"}}) {
    auto other = train_args(tmp.path / "other");
    add_sets(other, {"train.steps=4", "data.source=tokens:d.u16", change});
    other.push_back("--resume");
    other.push_back(step2.string());
    const Result r = train_in_tmp(other);
    INFO(change << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(expected));
  }
  // A changed key on a resume of the run in its own run_dir is named as the checkpoint's, not as
  // "run_dir holds another run" (run_dir is the resumed run's).
  auto own = args;
  add_sets(own, {"train.steps=6", "data.eos_id=3"});
  own.push_back("--resume");
  const Result changed = train_in_tmp(own);
  INFO(changed.err);
  CHECK(changed.exit_code == 2);
  CHECK_THAT(changed.err, Catch::Contains("data.eos_id: --resume continues the run saved in"));
  // run_dir holding a run on another file of the same kind and name: told apart by run.json's
  // content hash (the path alone is no evidence: a run may name its file from elsewhere).
  std::string other_tokens = tokens;  // the same length, other ids
  for (std::size_t i = 0; i < other_tokens.size(); i += 2) other_tokens[i] = static_cast<char>((i / 2) % 200);
  fs::create_directories(tmp.path / "elsewhere");
  write_file(tmp.path / "elsewhere" / "d.u16", other_tokens);
  auto other_run = train_args(tmp.path / "b");
  add_sets(other_run, {"train.steps=3", "data.source=tokens:" + (tmp.path / "elsewhere" / "d.u16").string()});
  must_run("atoll-train", other_run, tmp.path);
  const std::string b_metrics = read_file(tmp.path / "b" / "metrics.jsonl");
  auto into_b = train_args(tmp.path / "b");
  add_sets(into_b, {"train.steps=4", "data.source=tokens:d.u16", "checkpoint.dir=" + (tmp.path / "run" / "checkpoints").string()});
  into_b.push_back("--resume");
  into_b.push_back(step2.string());
  const Result spliced = train_in_tmp(into_b);
  INFO(spliced.err);
  CHECK(spliced.exit_code == 2);
  CHECK_THAT(spliced.err, Catch::Contains("holds another run (its run.json has a data file of content hash"));
  CHECK(read_file(tmp.path / "b" / "metrics.jsonl") == b_metrics);
}
