// atoll-plan end to end: the binary runs as a subprocess; the tests check exit codes and what it prints.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

std::string env_or_fail(const char* name) {
  const char* value = std::getenv(name);
  INFO("environment variable " << name << " (set by ctest)");
  REQUIRE(value != nullptr);
  return value;
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct PlanRun {
  int exit_code = -1;
  std::string out, err;
};

PlanRun run_plan(const std::vector<std::string>& args) {
  const fs::path binary = fs::path(env_or_fail("ATOLL_BINARY_DIR")) / "apps" / "atoll-plan";
  const fs::path scratch = fs::temp_directory_path() / std::string("atoll_plan_test_").append(std::to_string(::getpid()));
  fs::create_directories(scratch);
  std::string command = quoted(binary.string());
  for (const auto& a : args) command.append(" ").append(quoted(a));
  command.append(" >").append(quoted((scratch / "out.txt").string()));
  command.append(" 2>").append(quoted((scratch / "err.txt").string()));
  const int status = std::system(command.c_str());
  PlanRun r;
  r.exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(scratch / "out.txt");
  r.err = slurp(scratch / "err.txt");
  std::error_code ignored;
  fs::remove_all(scratch, ignored);
  return r;
}

// The first line of text that starts with `start` (empty when none does).
std::string line_of(const std::string& text, const std::string& start) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return {};
}

std::string tiny_config() { return (fs::path(env_or_fail("ATOLL_SOURCE_DIR")) / "configs" / "beam-tiny.yaml").string(); }

}  // namespace

TEST_CASE("atoll-plan: prints 11 units with the four router islands as fp32 rows for dp_shard 4", "[apps][plan]") {
  const PlanRun r = run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=4", "--world-size", "4"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("plan: 11 units (4 fp32 islands), precision bf16, sharded over 4 ranks per unit") !=
        std::string::npos);
  for (int l = 0; l < 4; ++l) {
    // Its row: name, role, params, elements, then storage, param and reduce dtypes, all fp32.
    const std::string name = "\nmodel.layers." + std::to_string(l) + ".mlp.gate ";
    const std::size_t at = r.out.find(name);
    REQUIRE(at != std::string::npos);
    std::istringstream row(r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1));
    std::string unit, role, params, elements, storage, param, reduce;
    row >> unit >> role >> params >> elements >> storage >> param >> reduce;
    CHECK(role == "island");
    CHECK(storage == "f32");
    CHECK(param == "f32");
    CHECK(reduce == "f32");
  }
  CHECK(r.out.find("dp_shard[0,1,2,3]") != std::string::npos);
  CHECK(r.out.find("per-rank memory estimate") != std::string::npos);
}

TEST_CASE("atoll-plan --graph: the step program of each tiny family as text, JSON and DOT", "[apps][plan]") {
  const fs::path configs = fs::path(env_or_fail("ATOLL_SOURCE_DIR")) / "configs";
  for (const char* name : {"beam-tiny.yaml", "flint-tiny.yaml", "inkling2-tiny.yaml"}) {
    INFO(name);
    const std::string config = (configs / name).string();
    const std::vector<std::string> hsdp = {config, "--set", "topology.mesh.dp_replicate=2", "--graph"};
    const PlanRun text = run_plan(hsdp);
    INFO(text.out << text.err);
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.rfind("op graph: ", 0) == 0);
    CHECK(text.out.find("\nstep program: ") != std::string::npos);
    CHECK(text.out.find(") -> (loss)") != std::string::npos);  // the head op writes the loss
    CHECK(text.out.find("all_gather over dp_shard") != std::string::npos);
    CHECK(text.out.find("all_reduce over dp_replicate") != std::string::npos);
    CHECK(text.out.find("backward  embed") != std::string::npos);

    std::vector<std::string> as_json = hsdp;
    as_json.insert(as_json.end(), {"--graph-format", "json"});
    const PlanRun json = run_plan(as_json);
    REQUIRE(json.exit_code == 0);
    const auto j = nlohmann::json::parse(json.out);
    // Every collective is posted by exactly one instruction, in sequence order.
    std::vector<std::uint64_t> posted;
    for (const auto& i : j.at("instructions")) {
      if (i.contains("collectives")) {
        for (const auto& c : i.at("collectives")) posted.push_back(c.get<std::uint64_t>());
      }
    }
    REQUIRE(posted.size() == j.at("collectives").size());
    for (std::size_t k = 0; k < posted.size(); ++k) {
      CHECK(posted[k] == k);
      CHECK(j.at("collectives")[k].at("seq").get<std::uint64_t>() == k);
    }

    std::vector<std::string> as_dot = hsdp;
    as_dot.insert(as_dot.end(), {"--graph-format", "dot"});
    const PlanRun dot = run_plan(as_dot);
    REQUIRE(dot.exit_code == 0);
    CHECK(dot.out.rfind("digraph step_program {", 0) == 0);
    CHECK(dot.out.find("c0 [label=\"#0 all_gather over dp_shard\"") != std::string::npos);
  }
  const PlanRun pp = run_plan({tiny_config(), "--set", "topology.mesh.pp=2", "--graph"});
  CHECK(pp.exit_code == 2);
  CHECK(pp.err.find("topology.mesh.pp") != std::string::npos);
  CHECK(run_plan({tiny_config(), "--graph", "--graph-format", "svg"}).exit_code == 2);
}

TEST_CASE("atoll-plan: ep must divide every MoE layer's expert count, and a model without experts takes ep 1",
          "[apps][plan]") {
  const PlanRun three = run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=3", "--set", "topology.mesh.ep=3",
                                  "--set", "train.global_batch=12"});
  CHECK(three.exit_code == 2);
  CHECK(three.err.find("topology.mesh.ep: expected ep to divide the number of experts of every MoE layer; "
                       "model.layers.0.mlp.experts.gate_and_up_projs holds 8 experts, ep is 3") != std::string::npos);
  const PlanRun dense = run_plan({tiny_config(), "--set", "model.preset=beam-tiny-dense", "--set",
                                  "topology.mesh.dp_shard=2", "--set", "topology.mesh.ep=2"});
  CHECK(dense.exit_code == 2);
  CHECK(dense.err.find("topology.mesh.ep: expected 1 for a model without routed experts (beam), got 2") !=
        std::string::npos);
  CHECK(run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=8", "--set", "topology.mesh.ep=8", "--set",
                  "train.global_batch=32"})
            .exit_code == 0);
}

TEST_CASE("atoll-plan: with ep > 1 every MoE layer's experts are an expert-group unit, counted once per owner",
          "[apps][plan][experts]") {
  const PlanRun r = run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=4", "--set", "topology.mesh.ep=2"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("(expert groups: 1/2 experts per EP rank over ep_shard 2)") != std::string::npos);
  // beam-tiny-moe: 8 experts of H 64, I 32 per layer: gate_up 8x64x64 + down 8x32x64 = 49152 elements;
  // each EP rank holds 4 experts, 24576 elements, half of them per ep_shard rank.
  const std::string row = line_of(r.out, "model.layers.0.mlp.experts ");
  INFO(row);
  CHECK(row.find(" experts ") != std::string::npos);
  CHECK(row.find(" 49152 ") != std::string::npos);
  CHECK(row.find(" 12288 ") != std::string::npos);
  // Every parameter once: the total is the model's parameter count.
  CHECK(line_of(r.out, "total").find(" 298224 ") != std::string::npos);
  CHECK(r.out.find("ep_shard 2 x ep 2: EP rank r owns experts [r E/2, (r+1) E/2)") != std::string::npos);
}

TEST_CASE("atoll-plan: prints layouts for pp and cp > 1 that atoll-train does not run yet, and ep's groups",
          "[apps][plan]") {
  const PlanRun r = run_plan({tiny_config(), "--set", "topology.mesh.pp=2", "--set", "topology.mesh.dp_shard=2",
                              "--set", "topology.mesh.cp=2", "--set", "topology.mesh.ep=2", "--world-size", "8"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("pp 2 x dp_replicate 1 x dp_shard 2 x cp 2 (ep 2) = 8 ranks") != std::string::npos);
  CHECK(r.out.find("cp[0,1]") != std::string::npos);
  CHECK(r.out.find("pp[0,4]") != std::string::npos);
  CHECK(r.out.find("ep[0,1]") != std::string::npos);
  CHECK(r.out.find("ep_shard[0,2]") != std::string::npos);
  CHECK(r.out.find("per-rank memory estimate, pipeline stage 0") != std::string::npos);
  CHECK(r.out.find("per-rank memory estimate, pipeline stage 1") != std::string::npos);
  CHECK(r.out.find("atoll-train does not run pp or cp > 1 yet") != std::string::npos);
  // beam-tiny: 4 layers over 2 stages; micro_batch 4 rows x (seq_len 32 / cp 2) tokens, hidden 64, bf16.
  CHECK(r.out.find("stage 0 -> 1 (before layer 2): hidden bf16[4, 16, 64]") != std::string::npos);
  CHECK(r.out.find("padded to") == std::string::npos);  // 32 tokens split into 2 x 2 chunks evenly

  // MODELS.md §5.7: a row is padded, not cut, to what cp splits evenly: Beam's load-balanced split
  // needs 2 x cp chunks (32 -> 36 for cp 3: two chunks of 6 per rank), Inkling2's contiguous one
  // cp (32 -> 33: 11 per rank).
  const PlanRun cp3 = run_plan({tiny_config(), "--set", "topology.mesh.pp=2", "--set", "topology.mesh.cp=3",
                                "--world-size", "6"});
  INFO(cp3.out << cp3.err);
  REQUIRE(cp3.exit_code == 0);
  CHECK(cp3.out.find("4 rows x 12 tokens per rank, seq_len 32 padded to 36 for cp") != std::string::npos);
  CHECK(cp3.out.find("hidden bf16[4, 12, 64]") != std::string::npos);

  // Inkling2 sends its depth history (completed blocks + the partial one) and the layout.
  const fs::path inkling2 = fs::path(env_or_fail("ATOLL_SOURCE_DIR")) / "configs" / "inkling2-tiny.yaml";
  const PlanRun ink = run_plan({inkling2.string(), "--set", "topology.mesh.pp=2"});
  INFO(ink.out << ink.err);
  REQUIRE(ink.exit_code == 0);
  CHECK(ink.out.find("): history ") != std::string::npos);
  CHECK(ink.out.find("): layout i64[") != std::string::npos);
  const PlanRun ink_cp3 = run_plan({inkling2.string(), "--set", "topology.mesh.pp=2", "--set", "topology.mesh.cp=3",
                                    "--world-size", "6"});
  INFO(ink_cp3.out << ink_cp3.err);
  REQUIRE(ink_cp3.exit_code == 0);
  CHECK(ink_cp3.out.find("x 11 tokens per rank, seq_len 32 padded to 33 for cp") != std::string::npos);
}

TEST_CASE("atoll-plan: bad configs exit 2 naming the key, the dense preset has no islands", "[apps][plan]") {
  const PlanRun ep = run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=4", "--set", "topology.mesh.ep=3"});
  CHECK(ep.exit_code == 2);
  CHECK(ep.err.find("topology.mesh.ep") != std::string::npos);
  CHECK(ep.err.find("expected a divisor of dp_replicate x dp_shard x cp = 4") != std::string::npos);

  const PlanRun world = run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=2", "--world-size", "3"});
  CHECK(world.exit_code == 2);
  CHECK(world.err.find("started 3") != std::string::npos);

  const PlanRun family = run_plan({tiny_config(), "--set", "model.family=gpt2"});
  CHECK(family.exit_code == 2);
  CHECK(family.err.find("model.family") != std::string::npos);

  const PlanRun preset = run_plan({tiny_config(), "--set", "model.family=flint"});  // Beam's preset name
  CHECK(preset.exit_code == 2);
  CHECK(preset.err.find("model.preset") != std::string::npos);

  CHECK(run_plan({}).exit_code == 2);  // CONFIG is required

  // What atoll-train refuses, atoll-plan refuses too (it would print a plan of a run that never runs).
  const PlanRun split = run_plan({tiny_config(), "--set", "topology.mesh.dp_shard=3"});
  CHECK(split.exit_code == 2);
  CHECK(split.err.find("train.global_batch: expected a multiple of") != std::string::npos);
  const PlanRun branching = run_plan({tiny_config(), "--set", "data.synthetic_branching=100000"});
  CHECK(branching.exit_code == 2);
  CHECK(branching.err.find("data.synthetic_branching: expected an integer in [1, 250]") != std::string::npos);

  const PlanRun dense = run_plan({tiny_config(), "--set", "model.preset=beam-tiny-dense", "--set", "precision=fp32"});
  INFO(dense.err);
  REQUIRE(dense.exit_code == 0);
  CHECK(dense.out.find("plan: 7 units (0 fp32 islands), precision fp32") != std::string::npos);
}
