// One atoll-train per node over UCX on loopback (issue 11): scripts/launch starts 2 processes of 2
// ranks each; the run equals the sim run of the same mesh bit for bit (losses in metrics.jsonl,
// checkpoint files byte for byte). Nodes that run different jobs exit 2 naming the key; a
// connection with a wrong token is refused and the job goes on.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "kernels/cpu/compute_pool.hpp"
#include "tests/apps/app_test_support.hpp"
#include "tests/support/free_port.hpp"

using namespace atl::testing;
using atl::checkpoint_dir_name;
using atl::latest_checkpoint;

namespace {

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s.append(" ").append(shell_quote(a));
  return s;
}

std::vector<std::string> train_args(const std::string& config, const fs::path& run_dir,
                                    const std::vector<const char*>& sets) {
  std::vector<std::string> args{source_path(config).string(), "--set", "run_dir=" + run_dir.string(), "--set",
                                "train.steps=10", "--set", "checkpoint.every=10"};
  for (const char* s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

// scripts/launch running the atoll-train ctest built (not whatever build/ holds).
std::string launch_script() {
  return "ATOLL_TRAIN=" + shell_quote(app_binary("atoll-train").string()) + " " +
         shell_quote(source_path("scripts/launch").string());
}

// atoll-train over UCX with the job token and `env` (variables that place the node).
std::string ucx_node_command(const std::string& env, const std::vector<std::string>& args,
                             const std::string& token = "secret") {
  return env + " ATOLL_JOB_TOKEN=" + shell_quote(token) + " " + shell_quote(app_binary("atoll-train").string()) +
         joined(args) + " --set topology.backend=ucx";
}

std::string node_command(int node, int nnodes, int port, const std::vector<std::string>& args,
                         const std::string& token = "secret") {
  return ucx_node_command("NODE_RANK=" + std::to_string(node) + " NNODES=" + std::to_string(nnodes) +
                              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port),
                          args, token);
}

// `command` run in `dir` (a node with its own working directory: its own copy of a relative path).
std::string in_dir(const fs::path& dir, const std::string& command) {
  return "cd " + shell_quote(dir.string()) + " && " + command;
}

// Node 1's command in a thread and node 0's here, at once; their results (node 0's first). Each
// node's output goes to `scratch` + its node rank.
std::pair<Result, Result> run_two_nodes(const std::string& node0, const std::string& node1, const fs::path& scratch) {
  Result second_result;
  std::thread second([&] { second_result = run_shell(node1, fs::path(scratch.string() + "1")); });
  Result first_result = run_shell(node0, fs::path(scratch.string() + "0"));
  second.join();
  return {std::move(first_result), std::move(second_result)};
}

}  // namespace

TEST_CASE("apps: atoll-train processes over UCX (2 nodes, and 3) equal the sim run bitwise, checkpoints byte for byte",
          "[apps][ucx]") {
  TempDir tmp;
  struct Case {
    const char* config;
    std::vector<const char*> sets;
    std::vector<const char*> ucx_sets = {};  // for the ucx run alone (the sim refuses ucx settings)
    int nnodes = 2;
  };
  // Every family on dp_shard 4 and on HSDP 2 x 2, fp32 and bf16; and expert parallelism across
  // the processes.
  std::vector<Case> cases;
  for (const char* config : {"configs/beam-tiny.yaml", "configs/flint-tiny.yaml", "configs/inkling2-tiny.yaml"}) {
    for (const char* precision : {"precision=fp32", "precision=bf16"}) {
      cases.push_back({config, {"topology.mesh.dp_shard=4", precision}});
      cases.push_back({config, {"topology.mesh.dp_shard=2", "topology.mesh.dp_replicate=2", precision}});
    }
  }
  cases.push_back({"configs/inkling2-tiny.yaml", {"topology.mesh.dp_shard=4", "topology.mesh.ep=2"}});
  // Without UCX's peer error handling (shared memory between the processes).
  cases.push_back({"configs/beam-tiny.yaml", {"topology.mesh.dp_shard=4"}, {"topology.ucx_peer_errors=false"}});
  // Three nodes: the non-zero ones hear each other's goodbyes only through node 0.
  cases.push_back({"configs/beam-tiny.yaml", {"topology.mesh.dp_shard=3", "train.global_batch=12"}, {}, 3});
  int n = 0;
  for (const Case& c : cases) {
    INFO(c.config << " " << c.sets.front() << " " << c.sets.back() << (c.ucx_sets.empty() ? "" : " (ucx settings)"));
    const fs::path sim_dir = tmp.path / ("sim" + std::to_string(n)), ucx_dir = tmp.path / ("ucx" + std::to_string(n));
    ++n;
    const Result sim = run_app("atoll-train", train_args(c.config, sim_dir, c.sets), tmp.path);
    REQUIRE(sim.exit_code == 0);
    std::vector<const char*> ucx_sets = c.sets;
    ucx_sets.insert(ucx_sets.end(), c.ucx_sets.begin(), c.ucx_sets.end());
    const Result ucx = run_shell(launch_script() + " --nnodes " + std::to_string(c.nnodes) + " --" +
                                     joined(train_args(c.config, ucx_dir, ucx_sets)),
                                 tmp.path / "launch");
    INFO(ucx.out << ucx.err);
    REQUIRE(ucx.exit_code == 0);
    for (int node = 1; node < c.nnodes; ++node) {  // each non-zero node logs behind its rank
      CHECK(ucx.err.find("[node " + std::to_string(node) + "] final loss=") != std::string::npos);
    }
    CHECK(ucx.err.find("atoll ucx:") == std::string::npos);  // a node's end is no failure at the others
    const auto a = read_metrics(sim_dir / "metrics.jsonl"), b = read_metrics(ucx_dir / "metrics.jsonl");
    REQUIRE(a.size() == 10);
    REQUIRE(b.size() == 10);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].at("loss").get<double>() == b[i].at("loss").get<double>());
      CHECK(a[i].at("grad_norm").get<double>() == b[i].at("grad_norm").get<double>());
    }
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      CHECK(read_file(sim_dir / "checkpoints" / "step-00000010" / file) ==
            read_file(ucx_dir / "checkpoints" / "step-00000010" / file));
    }
    CHECK(nlohmann::json::parse(read_file(ucx_dir / "run.json")).at("config").at("topology").at("backend") == "ucx");
  }
}

TEST_CASE("apps: nodes that run different jobs exit 2 naming the first differing key", "[apps][ucx]") {
  TempDir tmp;
  const int port = free_port();
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run", {"topology.mesh.dp_shard=2"});
  auto other = args;
  other.push_back("--set");
  other.push_back("train.lr=1.0e-3");
  // Node 1 placed by Slurm's variables alone: its error still says whose it is.
  const std::string slurm_node1 = ucx_node_command("SLURM_NODEID=1 SLURM_NNODES=2 SLURM_JOB_NODELIST=127.0.0.1 "
                                                   "MASTER_PORT=" + std::to_string(port), other);
  const auto [node0, node1] = run_two_nodes(node_command(0, 2, port, args), slurm_node1, tmp.path / "n");
  INFO(node0.err << node1.err);
  CHECK(node0.exit_code == 2);
  CHECK(node1.exit_code == 2);
  CHECK(node0.err.find("train.lr") != std::string::npos);
  CHECK_THAT(node1.err, Catch::StartsWith("[node 1] atoll-train: config error: ") && Catch::Contains("train.lr"));
  CHECK_FALSE(fs::exists(tmp.path / "run" / "metrics.jsonl"));
  // Another run_dir is named as itself, not as the checkpoint.dir it implies.
  const int port2 = free_port();
  const auto elsewhere = train_args("configs/beam-tiny.yaml", tmp.path / "other", {"topology.mesh.dp_shard=2"});
  const auto [first, second] = run_two_nodes(node_command(0, 2, port2, args), node_command(1, 2, port2, elsewhere),
                                             tmp.path / "m");
  INFO(first.err << second.err);
  CHECK(first.exit_code == 2);
  CHECK(second.exit_code == 2);
  CHECK_THAT(first.err, Catch::Contains("the first differing config key is run_dir"));
  // The same config, but node 1 counts 4 nodes (one rank each) where node 0 counts 2 (two each):
  // without the placement in the job, each would wait for ranks the other does not run.
  const int port3 = free_port();
  const auto four = train_args("configs/beam-tiny.yaml", tmp.path / "run", {"topology.mesh.dp_shard=4"});
  const auto [zero, one] = run_two_nodes(node_command(0, 2, port3, four), node_command(1, 4, port3, four), tmp.path / "p");
  INFO(zero.err << one.err);
  CHECK(zero.exit_code == 2);
  CHECK(one.exit_code == 2);
  CHECK_THAT(zero.err, Catch::Contains("launch.placement") && Catch::Contains("the nodes place the ranks differently") &&
                           Catch::Contains("node 0 runs 2 nodes"));
  CHECK_THAT(one.err, Catch::Contains("node 1 runs 4 nodes"));
}

TEST_CASE("apps: nodes whose copies of the data file differ, or cannot read theirs, exit 2 before any step",
          "[apps][ucx]") {
  TempDir tmp;
  // The same relative path in two working directories: one config, two files.
  for (const char* node : {"d0", "d1"}) fs::create_directories(tmp.path / node);
  write_file(tmp.path / "d0" / "corpus.txt", "the same path\n\nholds these bytes on node 0\n");
  write_file(tmp.path / "d1" / "corpus.txt", "the same path\n\nholds other bytes on node 1\n");
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run",
                               {"topology.mesh.dp_shard=2", "data.source=text:corpus.txt"});
  auto in = [&](const char* dir, int node, int port) {
    return in_dir(tmp.path / dir, node_command(node, 2, port, args));
  };
  {
    const int port = free_port();
    const auto [node0, node1] = run_two_nodes(in("d0", 0, port), in("d1", 1, port), tmp.path / "differ");
    INFO(node0.err << node1.err);
    CHECK(node0.exit_code == 2);
    CHECK(node1.exit_code == 2);
    for (const Result* r : {&node0, &node1}) {
      CHECK_THAT(r->err, Catch::Contains("data.content_hash (the nodes' copies of corpus.txt differ"));
    }
  }
  {
    fs::remove(tmp.path / "d1" / "corpus.txt");
    const int port = free_port();
    const auto [node0, node1] = run_two_nodes(in("d0", 0, port), in("d1", 1, port), tmp.path / "missing");
    INFO(node0.err << node1.err);
    CHECK(node0.exit_code == 2);
    CHECK_THAT(node0.err, Catch::Contains("data.content_hash"));
    CHECK(node1.exit_code == 2);  // its own reason
    CHECK_THAT(node1.err, Catch::Contains("data.source: corpus.txt: cannot open data file: No such file or directory"));
  }
  CHECK_FALSE(fs::exists(tmp.path / "run" / "metrics.jsonl"));
}

TEST_CASE("apps: a node whose data file changes in place mid-run ends the job: every node exits 2 with its reason",
          "[apps][ucx]") {
  TempDir tmp;
  // Three nodes, so that node 0 relays node 1's end to node 2 before it exits itself.
  const std::vector<std::string> dirs = {"d0", "d1", "d2"};
  for (const std::string& node : dirs) {  // each node's own copy, by one relative path
    fs::create_directories(tmp.path / node);
    std::string text;
    for (int i = 0; i < 200; ++i) text += "paragraph " + std::to_string(i) + " of the corpus every node holds\n\n";
    write_file(tmp.path / node / "corpus.txt", text);
  }
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run",
                               {"topology.mesh.dp_shard=3", "train.global_batch=12", "data.source=text:corpus.txt",
                                "train.steps=100000", "checkpoint.every=0", "train.log_every=1"});
  const int port = free_port();
  std::vector<Result> results(dirs.size());
  std::vector<std::thread> nodes;
  for (std::size_t n = 0; n < dirs.size(); ++n) {
    nodes.emplace_back([&, n] {
      results[n] = run_shell(in_dir(tmp.path / dirs[n], "timeout 120 env " + node_command(static_cast<int>(n), 3, port, args)),
                             tmp.path / ("edited" + std::to_string(n)));
    });
  }
  // Once the job trains, node 1's copy grows in place (the same inode).
  const fs::path metrics = tmp.path / "run" / "metrics.jsonl";
  bool trained = false;
  for (int i = 0; i < 600 && !trained; ++i) {
    trained = complete_lines(metrics) >= 1;
    if (!trained) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ofstream(tmp.path / "d1" / "corpus.txt", std::ios::app) << "an edit while the run reads the file\n";
  for (std::thread& t : nodes) t.join();
  CHECK(trained);  // (else the edit came before the job read the file: another failure)
  INFO(results[0].err << results[1].err << results[2].err);
  CHECK(results[1].exit_code == 2);
  CHECK_THAT(results[1].err, Catch::Contains("corpus.txt: the data file was modified in place"));
  for (const std::size_t other : {0, 2}) {  // not 1 for a lost node, which a launcher would restart
    CHECK(results[other].exit_code == 2);
    CHECK_THAT(results[other].err, Catch::Contains("node 1 ended the job (exit 2): ") &&
                                       Catch::Contains("corpus.txt: the data file was modified in place"));
  }
}

TEST_CASE("apps: node flags or torchrun's nodes without the ucx backend are a config error, not a whole job per node",
          "[apps][ucx]") {
  TempDir tmp;
  const std::vector<std::string> sim = {source_path("configs/beam-tiny.yaml").string(), "--set",
                                        "run_dir=" + (tmp.path / "run").string()};
  std::vector<std::string> flags = sim;
  flags.insert(flags.end(), {"--node-rank", "1", "--nnodes", "2"});
  const Result r = run_app("atoll-train", flags, tmp.path / "out");
  CHECK(r.exit_code == 2);
  // Node 1's error says whose it is, like its progress lines (nodes share a terminal).
  CHECK_THAT(r.err, Catch::StartsWith("[node 1] atoll-train: config error: ") &&
                        Catch::Contains("topology.backend: --node-rank, --nnodes, --master-addr and --master-port need ucx"));
  // torchrun's variables for node 1 of 2, no flags: refused the same way.
  std::string command = "GROUP_RANK=1 GROUP_WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "
                        "TORCHELASTIC_RUN_ID=none " + shell_quote(app_binary("atoll-train").string());
  for (const auto& a : sim) command.append(" ").append(shell_quote(a));
  const Result torchrun = run_shell(command, tmp.path / "torchrun");
  CHECK(torchrun.exit_code == 2);
  CHECK_THAT(torchrun.err, Catch::Contains("topology.backend: torchrun started this process as node 1 of 2") &&
                               Catch::Contains("expected ucx"));
  CHECK_FALSE(fs::exists(tmp.path / "run"));
  // torchrun with a single node: a sim job is whole there.
  const Result single = run_shell("GROUP_RANK=0 GROUP_WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 TORCHELASTIC_RUN_ID=none " +
                                      shell_quote(app_binary("atoll-train").string()) + " " + shell_quote(sim[0]) +
                                      " --set " + shell_quote(sim[2]) + " --set train.steps=2",
                                  tmp.path / "single");
  INFO(single.err);
  CHECK(single.exit_code == 0);
}

TEST_CASE("apps: a node alone at the rendezvous exits 1 after topology.rendezvous_timeout_s, naming the missing node",
          "[apps][ucx]") {
  TempDir tmp;
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run",
                               {"topology.mesh.dp_shard=2", "topology.rendezvous_timeout_s=1.5"});
  const Result node0 = run_shell(node_command(0, 2, free_port(), args), tmp.path / "n0");
  INFO(node0.err);
  CHECK(node0.exit_code == 1);
  CHECK_THAT(node0.err, Catch::Contains("1 of 2 nodes joined within 1.5 s (topology.rendezvous_timeout_s); missing: node 1"));
  CHECK_FALSE(fs::exists(tmp.path / "run" / "metrics.jsonl"));
}

TEST_CASE("apps: nodes that cannot split the mesh evenly, or a blank job token, exit 2 before the rendezvous",
          "[apps][ucx]") {
  TempDir tmp;
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run", {"topology.mesh.dp_shard=4"});
  const Result uneven = run_shell(node_command(0, 3, free_port(), args), tmp.path / "uneven");
  CHECK(uneven.exit_code == 2);
  CHECK_THAT(uneven.err, Catch::Contains("topology.mesh: 3 nodes cannot split a 4-rank mesh evenly (the node count "
                                         "from NNODES); topology.nodes gives each node its own number of ranks"));
  const Result no_token = run_shell(node_command(0, 2, free_port(), args, " "), tmp.path / "blank");
  CHECK(no_token.exit_code == 2);
  CHECK_THAT(no_token.err, Catch::Contains("topology.job_token_file: ATOLL_JOB_TOKEN is blank"));
  CHECK_FALSE(fs::exists(tmp.path / "run"));
}

TEST_CASE("apps: --trace on two nodes: each writes its own ranks' spans, node 1 beside node 0's name", "[apps][ucx]") {
  TempDir tmp;
  auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run", {"topology.mesh.dp_shard=4", "train.steps=2"});
  args.push_back("--trace");
  args.push_back((tmp.path / "traces" / "trace.json").string());
  const Result r = run_shell(launch_script() + " --nnodes 2 --" + joined(args), tmp.path / "launch");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto ranks_in = [](const fs::path& file) {
    std::vector<std::string> ranks;
    const nlohmann::json trace = nlohmann::json::parse(read_file(file));  // (a temporary's events would dangle)
    for (const auto& e : trace.at("traceEvents")) {
      if (e.value("name", "") == "process_name") ranks.push_back(e.at("args").at("name").get<std::string>());
    }
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  };
  CHECK(ranks_in(tmp.path / "traces" / "trace.json") == std::vector<std::string>{"rank 0", "rank 1"});
  CHECK(ranks_in(tmp.path / "traces" / "trace.node1.json") == std::vector<std::string>{"rank 2", "rank 3"});
}

TEST_CASE("apps: SIGINT to a node waiting at the rendezvous stops it at once with exit 130, nothing written",
          "[apps][ucx]") {
  TempDir tmp;
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run",
                               {"topology.mesh.dp_shard=2", "topology.rendezvous_timeout_s=120"});
  // Node 1 never comes; without the stop node 0 would wait 120 s and exit 1. SIGINT is sent once
  // atoll-train catches it (SigCgt mask 0x2): a background command of sh starts with it ignored. The
  // name must be atoll-train too: between fork and exec the child is sh, which catches SIGINT
  // under `sh -c` and dies of it (exit 130, nothing printed).
  const Result node0 = run_shell(
      "{ " + node_command(0, 2, free_port(), args) +
          " & pid=$!; for i in $(seq 400); do"
          " set -- $(awk '/^Name:/{n=$2} /^SigCgt:/{print n, $2}' /proc/$pid/status);"
          " [ \"$1\" = atoll-train ] && [ $((0x${2:-0} & 2)) -ne 0 ] && break; sleep 0.05; done;"
          " kill -INT $pid; wait $pid; }",
      tmp.path / "n0");
  INFO(node0.err);
  CHECK(node0.exit_code == 130);
  CHECK_THAT(node0.err, Catch::Contains("atoll-train: stopped by SIGINT while waiting for the other nodes at the "
                                        "rendezvous; nothing was written"));
  CHECK_FALSE(fs::exists(tmp.path / "run"));
}

TEST_CASE("apps: a connection with a wrong job token is refused and the job goes on", "[apps][ucx]") {
  TempDir tmp;
  const int port = free_port();
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run", {"topology.mesh.dp_shard=2"});
  Result node0;
  std::thread first([&] { node0 = run_shell(node_command(0, 2, port, args), tmp.path / "n0"); });
  // An intruder: connects once node 0 listens, greets with the wrong token, and is told it was
  // refused (never the token).
  bool refused_sent = false;
  std::string reply;
  for (int attempt = 0; attempt < 600 && !refused_sent; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = loopback(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string hello = R"({"token":"wrong","node":1,"job":"{}","addresses":{}})";
      const std::uint32_t length = htonl(static_cast<std::uint32_t>(hello.size()));
      refused_sent = ::send(fd, &length, 4, MSG_NOSIGNAL) == 4 &&
                     ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size());
      char buffer[512];
      for (ssize_t n; refused_sent && (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) reply.append(buffer, n);
    }
    ::close(fd);
    if (!refused_sent) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(refused_sent);
  CHECK_THAT(reply, Catch::Contains(R"("refused":"with a wrong job token")") && !Catch::Contains("secret"));
  // A node of this job started with another token: refused at once, exit 2, naming the token.
  const Result misconfigured = run_shell(node_command(1, 2, port, args, "other!"), tmp.path / "wrong");
  CHECK(misconfigured.exit_code == 2);
  CHECK_THAT(misconfigured.err, Catch::Contains("refused this node's connection with a wrong job token (every node "
                                                "needs the same ATOLL_JOB_TOKEN"));
  const Result node1 = run_shell(node_command(1, 2, port, args), tmp.path / "n1");
  first.join();
  INFO(node0.err << node1.err);
  CHECK(node0.exit_code == 0);
  CHECK(node1.exit_code == 0);
  CHECK(node0.err.find("rendezvous: refused a connection with a wrong job token") != std::string::npos);
  CHECK(read_metrics(tmp.path / "run" / "metrics.jsonl").size() == 10);
}

namespace {

// Once node 0 has written `after` steps to run_dir's metrics, sends `signal` (a pkill name) to the
// newest atoll-train process of that run; false if the run never got there (a deadlock watchdog,
// not a timing claim).
bool signal_a_node(const fs::path& run_dir, std::size_t after, const char* signal) {
  const fs::path metrics = run_dir / "metrics.jsonl";
  for (int poll = 0; poll < 6000; ++poll) {
    if (complete_lines(metrics) >= after) {
      // Appended piecewise: chained `+` on temporaries trips a false -Wrestrict in GCC 12.
      std::string pattern = "^";
      pattern.append(app_binary("atoll-train").string()).append(" .*run_dir=").append(run_dir.string()).append(" ");
      std::string command = "pkill -";
      command.append(signal).append(" -n -f ").append(shell_quote(pattern));
      return std::system(command.c_str()) == 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Runs scripts/launch with `launch_args` in the background; once node 0 has written `after`
// steps, SIGKILLs one node process of the run; returns the launcher's result.
Result launch_and_kill_a_node(const std::string& launch_args, const fs::path& run_dir, std::size_t after,
                              const fs::path& scratch) {
  Result launched;
  std::thread launcher([&] {
    launched = run_shell(launch_script() + " " + launch_args, scratch);
  });
  const bool killed = signal_a_node(run_dir, after, "KILL");
  launcher.join();
  CHECK(killed);
  return launched;
}

}  // namespace

TEST_CASE("scripts/launch: a restart after the start resumes the latest checkpoint, before it repeats the start",
          "[apps][launch]") {
  TempDir tmp;
  // A stand-in atoll-train: node 0 records its arguments and fails once, having reached its
  // first step (ATOLL_LAUNCH_STARTED created) or not; node 1 succeeds.
  const fs::path fake = tmp.path / "fake-train", log = tmp.path / "args", failed = tmp.path / "failed",
                 reach = tmp.path / "reach-first-step";
  write_file(fake, "#!/usr/bin/env bash\nif [[ $NODE_RANK == 0 ]]; then\n  echo \"$*\" >> " + shell_quote(log.string()) +
                       "\n  if [[ ! -e " + shell_quote(failed.string()) + " ]]; then\n    touch " +
                       shell_quote(failed.string()) + "\n    if [[ -e " + shell_quote(reach.string()) +
                       " ]]; then touch \"$ATOLL_LAUNCH_STARTED\"; fi\n    exit 1\n  fi\nfi\nexit 0\n");
  fs::permissions(fake, fs::perms::owner_all);
  const std::string launch = "ATOLL_TRAIN=" + shell_quote(fake.string()) + " " +
                             shell_quote(source_path("scripts/launch").string());
  const std::string given = "cfg.yaml --resume /a/step-00000100 --set x=1 --resume=/b --resume-if-any --resume --overwrite";
  auto restarted = [&](bool started) {
    fs::remove(log);
    fs::remove(failed);
    if (started) write_file(reach, "");
    const Result r = run_shell(launch + " --nnodes 2 --max-restarts 1 -- " + given, tmp.path / "run");
    INFO(r.err);
    CHECK(r.exit_code == 0);
    return read_file(log);
  };
  // Failed before its first step: nothing of --resume DIR or --overwrite was acted on, so the
  // restart repeats them.
  CHECK(restarted(false) == given + " --set topology.backend=ucx\n" + given + " --set topology.backend=ucx\n");
  // Failed after: the latest checkpoint, whatever the first start named (--overwrite was done).
  CHECK(restarted(true) == given + " --set topology.backend=ucx\n" +
                               "cfg.yaml --set x=1 --resume-if-any --set topology.backend=ucx\n");
  // SIGTERM to the launcher reaches every node once (a second would end it unsaved); they exit
  // 143 and no restart follows, --max-restarts or not.
  const fs::path stopping = tmp.path / "stopping-train", signals = tmp.path / "signals";
  write_file(stopping, "#!/usr/bin/env bash\nstop=0\ntrap 'echo \"$NODE_RANK TERM\" >> " + shell_quote(signals.string()) +
                           "; stop=1' TERM\ntouch " + shell_quote(tmp.path.string()) +
                           "/ready-$NODE_RANK\nwhile ((stop == 0)); do sleep 0.05; done\nexit 143\n");
  fs::permissions(stopping, fs::perms::owner_all);
  const Result stop = run_shell(
      "ATOLL_TRAIN=" + shell_quote(stopping.string()) + " " + shell_quote(source_path("scripts/launch").string()) +
          " --nnodes 2 --max-restarts 3 -- cfg.yaml & launcher=$!; until [ -e " +
          shell_quote((tmp.path / "ready-0").string()) + " ] && [ -e " + shell_quote((tmp.path / "ready-1").string()) +
          " ]; do sleep 0.05; done; kill -TERM $launcher; wait $launcher; echo \"launcher $?\"",
      tmp.path / "stop");
  CHECK(stop.out == "launcher 143\n");
  std::string lines = read_file(signals);
  CHECK((lines == "0 TERM\n1 TERM\n" || lines == "1 TERM\n0 TERM\n"));
  CHECK_THAT(stop.err, !Catch::Contains("restart"));
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {" --nnodes", "--nnodes: expected a value"},
           {" --nnodes 2 --port", "--port: expected a value"},
           {" --nnodes 2 --max-restarts", "--max-restarts: expected a value"},
           {" --nnodes 0 -- cfg.yaml", "--nnodes: expected a positive integer, got '0'"},
           {" -- cfg.yaml", "--nnodes is required"},
           {" --nnodes 2 --port 70000 -- cfg.yaml", "--port: expected a port in [1, 65535], got '70000'"},
           {" --nnodes 2 --port 18446744073709551617 -- cfg.yaml", "--port: expected a port in [1, 65535], got '18446744073709551617'"},
           {" --nnodes 2 --max-restarts 08 -- cfg.yaml", "--max-restarts: expected a non-negative integer, got '08'"},
           {" --nnodes 2 --max-restarts -1 -- cfg.yaml", "--max-restarts: expected a non-negative integer, got '-1'"},
           {" --nnodes 2 cfg.yaml", "unknown argument 'cfg.yaml' (atoll-train's arguments go after --)"},
           {" --nnodes 2 --", "no CONFIG after --"}}) {
    INFO(bad);
    const Result usage = run_shell(launch + bad, tmp.path / "usage");
    CHECK(usage.exit_code == 2);
    CHECK_THAT(usage.err, Catch::Contains("scripts/launch: " + why + "\nusage: scripts/launch"));
  }
  const Result help = run_shell(launch + " --help", tmp.path / "usage");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::StartsWith("usage: scripts/launch --nnodes N"));
}

TEST_CASE("scripts/launch: bad input (2) and non-finite training (3) end the job without a restart", "[apps][launch]") {
  TempDir tmp;
  for (const int code : {2, 3}) {
    INFO(code);
    const fs::path fake = tmp.path / ("fake-" + std::to_string(code)), runs = tmp.path / ("runs-" + std::to_string(code));
    // A stand-in atoll-train: node 0 counts its starts and exits `code`; node 1 succeeds.
    write_file(fake, "#!/usr/bin/env bash\nif [[ $NODE_RANK == 0 ]]; then echo x >> " + shell_quote(runs.string()) +
                         "; exit " + std::to_string(code) + "; fi\nexit 0\n");
    fs::permissions(fake, fs::perms::owner_all);
    const Result r = run_shell("ATOLL_TRAIN=" + shell_quote(fake.string()) + " " +
                                   shell_quote(source_path("scripts/launch").string()) +
                                   " --nnodes 2 --max-restarts 3 -- cfg.yaml",
                               tmp.path / ("out-" + std::to_string(code)));
    INFO(r.err);
    CHECK(r.exit_code == code);
    CHECK(read_file(runs) == "x\n");  // started once
    CHECK_THAT(r.err, !Catch::Contains("restart"));
  }
}

// Shell: scripts/launch (with `flags`) training beam-tiny on 2 nodes for 100000 steps in the
// background as $launcher, waited on until run's metrics.jsonl has 3 lines.
std::string launched_past_step_3(const fs::path& run, const std::string& flags) {
  const std::string metrics = shell_quote((run / "metrics.jsonl").string());
  return launch_script() + " --nnodes 2 " + flags + " --" +
         joined(train_args("configs/beam-tiny.yaml", run,
                           {"topology.mesh.dp_shard=2", "train.steps=100000", "checkpoint.every=1000"})) +
         " & launcher=$!; for i in $(seq 600); do [ \"$(cat " + metrics +
         " 2>/dev/null | wc -l)\" -ge 3 ] && break; sleep 0.1; done; ";
}

// A SIGTERM stop of that job: the last step recorded was saved, and node 1 said why it stopped.
void check_stopped_by_sigterm_and_saved(const fs::path& run, const std::string& err) {
  const auto lines = read_metrics(run / "metrics.jsonl");
  REQUIRE(lines.size() >= 3);
  const auto latest = latest_checkpoint(run / "checkpoints");
  REQUIRE(latest.has_value());
  CHECK(latest->filename() == checkpoint_dir_name(static_cast<std::int64_t>(lines.size())));
  CHECK_THAT(err, Catch::Contains("[node 1] atoll-train: stopped by SIGTERM after step " + std::to_string(lines.size())));
}

TEST_CASE("scripts/launch: nodes whose launcher is killed stop after their step, saved, instead of training on",
          "[apps][launch]") {
  TempDir tmp;
  // SIGKILL (or the OOM killer) leaves the launcher no chance to forward a stop, and the nodes run
  // in sessions of their own: they trained on, orphaned. Its death is now a stop request.
  const fs::path run = tmp.path / "run";
  const Result r = run_shell(
      "( " + launched_past_step_3(run, "") +
          "nodes=$(cat /proc/$launcher/task/*/children); kill -KILL $launcher; wait $launcher; "
          "for i in $(seq 1200); do alive=0; for p in $nodes; do kill -0 $p 2>/dev/null && alive=1; done; "
          "[ $alive = 0 ] && break; sleep 0.1; done; "
          "if [ $alive = 0 ]; then echo 'nodes gone'; else echo 'nodes alive'; kill -KILL $nodes; fi )",
      tmp.path / "out");
  INFO(r.err);
  REQUIRE(r.out.find("nodes gone") != std::string::npos);
  check_stopped_by_sigterm_and_saved(run, r.err);
}

TEST_CASE("apps: weights that turn non-finite at node 0's save end every node with exit 3, no restart",
          "[apps][ucx]") {
  TempDir tmp;
  // Step 1's loss and norm are finite, AdamW's update at this rate is not; node 0 alone holds the
  // whole state and finds it at the save.
  const Result r = run_shell(launch_script() + " --nnodes 2 --max-restarts 2 --" +
                                 joined(train_args("configs/beam-tiny.yaml", tmp.path / "run",
                                                   {"topology.mesh.dp_shard=4", "train.steps=6", "checkpoint.every=1",
                                                    "train.lr=1.0e38", "train.warmup=0", "train.grad_clip=0"})),
                             tmp.path / "out");
  INFO(r.err);
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.err, Catch::Contains("[node 1] atoll-train: node 0 ended the job (exit 3): non-finite training: step 1"));
  CHECK_THAT(r.err, !Catch::Contains("launch: restart"));
  CHECK_FALSE(fs::exists(tmp.path / "run" / "checkpoints" / "step-00000001"));
}

TEST_CASE("scripts/launch: a stop sent to the launcher and to every node at once is one stop, saved",
          "[apps][launch]") {
  TempDir tmp;
  // A scheduler signals every process of the job: each node gets SIGTERM directly and once more
  // from the launcher. That is one request (a second would end a node unsaved): every node
  // finishes its step, the checkpoint of that step is saved, and the job ends 143, no restart.
  const fs::path run = tmp.path / "run";
  const Result r = run_shell("( " + launched_past_step_3(run, "--max-restarts 2") +
                                 "kill -TERM $launcher $(cat /proc/$launcher/task/*/children); wait $launcher; "
                                 "echo \"launcher $?\" )",
                             tmp.path / "out");
  INFO(r.err);
  CHECK(r.out.find("launcher 143") != std::string::npos);
  check_stopped_by_sigterm_and_saved(run, r.err);
  CHECK_THAT(r.err, !Catch::Contains("restart"));
}

TEST_CASE("apps: a node killed mid-run stops the job naming it, and --max-restarts resumes to the same losses",
          "[apps][ucx]") {
  TempDir tmp;
  const auto args = [&](const fs::path& run_dir) {
    return joined({source_path("configs/beam-tiny.yaml").string(), "--set", "run_dir=" + run_dir.string(), "--set",
                   "topology.mesh.dp_shard=4", "--set", "train.steps=120", "--set", "checkpoint.every=20"});
  };
  const Result reference =
      run_shell(shell_quote(app_binary("atoll-train").string()) + args(tmp.path / "ref"), tmp.path / "ref_out");
  REQUIRE(reference.exit_code == 0);

  // Without restarts: the job stops, non-zero, and the survivor names the lost node and its ranks.
  const Result stopped = launch_and_kill_a_node("--nnodes 2 --" + args(tmp.path / "stop"), tmp.path / "stop", 30,
                                                tmp.path / "stop_out");
  INFO(stopped.err);
  // The launcher names the killed node (pkill -n: node 1, the newest) and exits with its code,
  // not with the survivor's 1 (which wait -n may report first).
  CHECK(stopped.exit_code == 137);
  CHECK(stopped.err.find("launch: node 1 exited with code 137; stopping the others") != std::string::npos);
  CHECK(stopped.err.find(": lost node ") != std::string::npos);
  CHECK(stopped.err.find("(ranks ") != std::string::npos);

  // With one restart: the job resumes from its latest checkpoint and ends as if never stopped.
  const Result resumed = launch_and_kill_a_node("--nnodes 2 --max-restarts 1 --" + args(tmp.path / "restart"),
                                                tmp.path / "restart", 50, tmp.path / "restart_out");
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.err.find("launch: restart 1 of 1 from the latest complete checkpoint") != std::string::npos);
  const auto a = read_metrics(tmp.path / "ref" / "metrics.jsonl");
  const auto b = read_metrics(tmp.path / "restart" / "metrics.jsonl");
  REQUIRE(a.size() == 120);
  REQUIRE(b.size() == 120);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].at("loss").get<double>() == b[i].at("loss").get<double>());

  // A job begun from another run's checkpoint (step 80 of ref) and killed before its first save:
  // the restart begins from that checkpoint again (run.json's began_from), not from a fresh
  // model, and ends as the reference does.
  const fs::path other = tmp.path / "other";
  const Result from_other = launch_and_kill_a_node(
      "--nnodes 2 --max-restarts 1 --" + args(other) + " --set checkpoint.every=1000 --resume " +
          shell_quote((tmp.path / "ref" / "checkpoints" / "step-00000080").string()),
      other, 5, tmp.path / "other_out");
  INFO(from_other.out << from_other.err);  // both: the start lines name where each attempt began
  REQUIRE(from_other.exit_code == 0);
  CHECK(from_other.err.find("launch: restart 1 of 1 from the latest complete checkpoint") != std::string::npos);
  const auto c = read_metrics(other / "metrics.jsonl");
  REQUIRE(c.size() == 40);
  CHECK(c.front().at("step").get<std::int64_t>() == 81);
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i].at("loss").get<double>() == a[i + 80].at("loss").get<double>());
}

TEST_CASE("apps: nodes placed by Slurm's variables (a --master-port flag, a job token file) train together",
          "[apps][ucx]") {
  TempDir tmp;
  const int port = free_port();
  const fs::path token = tmp.path / "token";
  std::ofstream(token) << "t0ken\n";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run",
                               {"topology.mesh.dp_shard=2"});
  auto command = [&](int node, const std::string& token_file) {
    return "env -u ATOLL_JOB_TOKEN SLURM_NODEID=" + std::to_string(node) +
           " SLURM_NNODES=2 SLURM_JOB_NODELIST=127.0.0.1 " + shell_quote(app_binary("atoll-train").string()) +
           joined(args) + " --set topology.backend=ucx --master-port " + std::to_string(port) +
           (token_file.empty() ? "" : " --set topology.job_token_file=" + shell_quote(token_file));
  };
  // No token at all: a config error before any connection.
  const Result tokenless = run_shell(command(0, ""), tmp.path / "none");
  CHECK(tokenless.exit_code == 2);
  CHECK_THAT(tokenless.err, Catch::Contains("topology.job_token_file: ") && Catch::Contains("needs a job token"));

  const auto [node0, node1] = run_two_nodes(command(0, token.string()), command(1, token.string()), tmp.path / "n");
  INFO(node0.err << node1.err);
  CHECK(node0.exit_code == 0);
  CHECK(node1.exit_code == 0);
  CHECK(node1.err.find("[node 1] final loss=") != std::string::npos);
  CHECK(read_metrics(tmp.path / "run" / "metrics.jsonl").size() == 10);
}

TEST_CASE("apps: nodes placed by torchrun's variables train beside torchrun's agent store on MASTER_PORT",
          "[apps][ucx]") {
  TempDir tmp;
  const HeldPort agent_store = listen_below_free_successor();  // torchrun's agent serves its store here
  REQUIRE(agent_store.fd >= 0);
  const int port = agent_store.port;
  // (A node that took the store for node 0 would wait for its answer until the timeout.)
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run",
                               {"topology.mesh.dp_shard=2", "topology.rendezvous_timeout_s=30"});
  // What torchrun 2.15 exports to each worker of `torchrun --nnodes 2 --nproc-per-node 1`.
  auto command = [&](int node, int local_world) {
    return ucx_node_command("GROUP_RANK=" + std::to_string(node) + " RANK=" + std::to_string(node) +
                                " GROUP_WORLD_SIZE=2 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=" +
                                std::to_string(local_world) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                                std::to_string(port) + " TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID=none",
                            args);
  };
  // Two processes per node would be two node 0s: refused before any connection.
  const Result two_per_node = run_shell(command(0, 2), tmp.path / "two");
  CHECK(two_per_node.exit_code == 2);
  CHECK_THAT(two_per_node.err, Catch::Contains("LOCAL_WORLD_SIZE (torchrun)") && Catch::Contains("expected 1"));

  const auto [node0, node1] = run_two_nodes(command(0, 1), command(1, 1), tmp.path / "n");
  ::close(agent_store.fd);
  INFO(node0.err << node1.err);
  CHECK(node0.exit_code == 0);
  CHECK(node1.exit_code == 0);
  CHECK(read_metrics(tmp.path / "run" / "metrics.jsonl").size() == 10);
  // One rank per node: compute.threads' default is every core of the node (as the engine uses),
  // not the share of a process that ran the whole 2-rank mesh.
  const auto run_json = nlohmann::json::parse(read_file(tmp.path / "run" / "run.json"));
  CHECK(run_json.at("compute_threads").get<int>() == atl::cpu::default_compute_threads(1));
}

TEST_CASE("apps: SIGINT to one node stops every node after the same step with exit 130, saved, and --resume continues exactly",
          "[apps][ucx]") {
  TempDir tmp;
  const int port = free_port();
  const fs::path run_dir = tmp.path / "run";
  auto args = train_args("configs/beam-tiny.yaml", run_dir, {"topology.mesh.dp_shard=4"});
  for (std::string& a : args) {
    if (a == "train.steps=10") a = "train.steps=120";
  }
  Result node1;
  std::thread second([&] { node1 = run_shell(node_command(1, 2, port, args), tmp.path / "n1"); });
  Result node0;
  std::thread first([&] { node0 = run_shell(node_command(0, 2, port, args), tmp.path / "n0"); });
  const bool signalled = signal_a_node(run_dir, 20, "INT");  // the newest process: one node only
  first.join();
  second.join();
  INFO(node0.err << node1.err);
  REQUIRE(signalled);
  // Both end by the signal one was sent (a launcher reads the job's end alike from any node), and
  // the other says it was not its own.
  CHECK(node0.exit_code == 130);
  CHECK(node1.exit_code == 130);
  const std::string elsewhere = "stopped by SIGINT (sent to another process of the job) after step";
  CHECK((node0.err.find(elsewhere) != std::string::npos) != (node1.err.find(elsewhere) != std::string::npos));
  const auto stopped = read_metrics(run_dir / "metrics.jsonl");
  REQUIRE(stopped.size() < 120);
  const std::int64_t last = stopped.back().at("step").get<std::int64_t>();
  CHECK(node0.err.find("after step " + std::to_string(last) + " of 120") != std::string::npos);
  CHECK(node1.err.find("after step " + std::to_string(last) + " of 120") != std::string::npos);
  // Resumed (both nodes), the run ends with the uninterrupted run's losses.
  auto resumed = args;
  resumed.push_back("--resume");
  const Result again = run_shell(launch_script() + " --nnodes 2 --" + joined(resumed),
                                 tmp.path / "resume");
  INFO(again.err);
  REQUIRE(again.exit_code == 0);
  const Result reference = run_app("atoll-train", train_args("configs/beam-tiny.yaml", tmp.path / "ref",
                                                             {"topology.mesh.dp_shard=4", "train.steps=120"}),
                                   tmp.path / "ref_out");
  REQUIRE(reference.exit_code == 0);
  const auto a = read_metrics(run_dir / "metrics.jsonl"), b = read_metrics(tmp.path / "ref" / "metrics.jsonl");
  REQUIRE(a.size() == 120);
  REQUIRE(b.size() == 120);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].at("loss").get<double>() == b[i].at("loss").get<double>());
}

TEST_CASE("apps: node 0 alone reads the checkpoint to resume from, a node with no view of it resumes too",
          "[apps][ucx]") {
  // Relative run_dir and checkpoint.dir, node 0 working in a/, node 1 in b/: the same config, but
  // only node 0 sees the checkpoints (as on two machines without a shared file system).
  TempDir tmp;
  fs::create_directories(tmp.path / "a");
  fs::create_directories(tmp.path / "b");
  auto args = [&](int steps, bool resume) {
    std::vector<std::string> a{source_path("configs/beam-tiny.yaml").string(), "--set", "run_dir=run",
                               "--set", "train.steps=" + std::to_string(steps), "--set", "checkpoint.every=5",
                               "--set", "topology.mesh.dp_shard=4"};
    if (resume) a.push_back("--resume");
    return a;
  };
  auto job = [&](int steps, bool resume, const std::string& phase) {
    const int port = free_port();
    auto in = [&](const char* dir, int node) {
      return in_dir(tmp.path / dir, node_command(node, 2, port, args(steps, resume)));
    };
    return run_two_nodes(in("a", 0), in("b", 1), tmp.path / phase);
  };
  // Nothing to resume yet: node 0 says why (exit 2) and node 1 hands on node 0's reason, with
  // its exit code (bad input: a launcher must not restart).
  const auto [none0, none1] = job(10, true, "none");
  CHECK(none0.exit_code == 2);
  CHECK_THAT(none0.err, Catch::Contains("--resume found no complete checkpoint"));
  CHECK(none1.exit_code == 2);
  CHECK_THAT(none1.err, Catch::Contains("node 0 did not start: ") &&
                            Catch::Contains("--resume found no complete checkpoint"));

  const auto [first0, first1] = job(10, false, "first");
  INFO(first0.err << first1.err);
  REQUIRE(first0.exit_code == 0);
  REQUIRE(first1.exit_code == 0);
  CHECK_FALSE(fs::exists(tmp.path / "b" / "run"));  // node 1 writes nothing
  // The same job again without --resume or --overwrite: node 0 refuses run_dir, node 1 says why,
  // both as bad input.
  const auto [again_fresh0, again_fresh1] = job(10, false, "refused");
  CHECK(again_fresh0.exit_code == 2);
  CHECK(again_fresh1.exit_code == 2);
  CHECK_THAT(again_fresh1.err, Catch::Contains("node 0 did not start: ") && Catch::Contains("already holds a run"));
  const auto [again0, again1] = job(15, true, "again");
  INFO(again0.err << again1.err);
  REQUIRE(again0.exit_code == 0);
  REQUIRE(again1.exit_code == 0);
  CHECK(again1.err.find("resumed from run/checkpoints/step-00000010 at step 10") != std::string::npos);

  const Result reference = run_app("atoll-train", train_args("configs/beam-tiny.yaml", tmp.path / "ref",
                                                             {"topology.mesh.dp_shard=4", "train.steps=15"}),
                                   tmp.path / "ref_out");
  REQUIRE(reference.exit_code == 0);
  const auto a = read_metrics(tmp.path / "a" / "run" / "metrics.jsonl");
  const auto b = read_metrics(tmp.path / "ref" / "metrics.jsonl");
  REQUIRE(a.size() == 15);
  REQUIRE(b.size() == 15);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].at("loss").get<double>() == b[i].at("loss").get<double>());
}

TEST_CASE("apps: nodes placed by topology.nodes (one rank on node 0, three on node 1) train like the sim",
          "[apps][ucx]") {
  TempDir tmp;
  const int port = free_port();
  const std::string nodes = "topology.nodes=[{host: 127.0.0.1, port: " + std::to_string(port) +
                            ", ranks: 1}, {host: 127.0.0.1, ranks: 3}]";
  const auto args = train_args("configs/beam-tiny.yaml", tmp.path / "run", {"topology.mesh.dp_shard=4"});
  auto command = [&](int node) {
    return "ATOLL_JOB_TOKEN=t " + shell_quote(app_binary("atoll-train").string()) + joined(args) +
           " --set topology.backend=ucx --set " + shell_quote(nodes) + " --node-rank " + std::to_string(node);
  };
  const auto [node0, node1] = run_two_nodes(command(0), command(1), tmp.path / "n");
  INFO(node0.err << node1.err);
  REQUIRE(node0.exit_code == 0);
  REQUIRE(node1.exit_code == 0);
  const Result sim = run_app("atoll-train", train_args("configs/beam-tiny.yaml", tmp.path / "sim",
                                                       {"topology.mesh.dp_shard=4"}),
                             tmp.path / "sim_out");
  REQUIRE(sim.exit_code == 0);
  const auto a = read_metrics(tmp.path / "run" / "metrics.jsonl"), b = read_metrics(tmp.path / "sim" / "metrics.jsonl");
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].at("loss").get<double>() == b[i].at("loss").get<double>());
  // Ranks that do not add up to the mesh: exit 2 naming topology.nodes, nothing written.
  const Result bad = run_shell("ATOLL_JOB_TOKEN=t " + shell_quote(app_binary("atoll-train").string()) +
                                   joined(train_args("configs/beam-tiny.yaml", tmp.path / "bad",
                                                     {"topology.mesh.dp_shard=2"})) +
                                   " --set topology.backend=ucx --set " + shell_quote(nodes) + " --node-rank 0",
                               tmp.path / "bad_out");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("topology.nodes: the nodes' ranks add up to 4, the mesh has 2") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "bad"));
}
