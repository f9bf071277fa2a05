// Where a process sits in a multi-process job (issue 11): flags over torchrun's variables over
// Slurm's, field by field; Slurm node lists; ranks per node.
#include <catch2/catch.hpp>

#include <map>

#include "graph/launch/node_spec.hpp"

using namespace atl;

namespace {

Environment env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("node spec: flags, then torchrun's variables, then Slurm's, field by field", "[launch]") {
  const auto slurm = env_of({{"SLURM_NODEID", "2"}, {"SLURM_NNODES", "4"}, {"SLURM_JOB_NODELIST", "gpu[07-10]"}});
  NodeSpec s = resolve_node_spec({}, slurm);
  CHECK(s.node_rank == 2);
  CHECK(s.nnodes == 4);
  CHECK(s.master_addr == "gpu07");
  CHECK(s.master_port == 29500);
  CHECK(s.source().find("SLURM_NODEID (Slurm)") != std::string::npos);

  // What torchrun 2.15 gives each worker of `torchrun --nnodes 2 --node-rank 1 --nproc-per-node 1`.
  const auto torchrun = env_of({{"SLURM_NODEID", "2"}, {"SLURM_NNODES", "4"}, {"SLURM_JOB_NODELIST", "gpu[07-10]"},
                                {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"RANK", "1"}, {"WORLD_SIZE", "2"},
                                {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}, {"MASTER_ADDR", "10.0.0.5"},
                                {"MASTER_PORT", "1234"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  s = resolve_node_spec({}, torchrun);
  CHECK(s.node_rank == 1);  // torchrun before Slurm
  CHECK(s.nnodes == 2);
  CHECK(s.master_addr == "10.0.0.5");
  CHECK(s.master_port == 1235);  // torchrun's agent serves its own store on MASTER_PORT
  CHECK(s.source().find("MASTER_PORT + 1") != std::string::npos);

  NodeFlags flags;
  flags.node_rank = 0;
  flags.master_port = 4321;
  s = resolve_node_spec(flags, torchrun);
  CHECK(s.node_rank == 0);  // flags first
  CHECK(s.nnodes == 2);
  CHECK(s.master_port == 4321);

  // Without GROUP_WORLD_SIZE: nodes from WORLD_SIZE / LOCAL_WORLD_SIZE; MASTER_PORT as given without an agent store.
  s = resolve_node_spec({}, env_of({{"GROUP_RANK", "2"}, {"WORLD_SIZE", "3"}, {"LOCAL_WORLD_SIZE", "1"},
                                    {"MASTER_PORT", "1234"}}));
  CHECK(s.node_rank == 2);
  CHECK(s.nnodes == 3);
  CHECK(s.master_port == 1234);
  // torchrun's rendezvous decides: its GROUP_RANK and GROUP_WORLD_SIZE before a NODE_RANK or
  // NNODES the script exports too (c10d assigns group ranks in order of joining).
  s = resolve_node_spec({}, env_of({{"NODE_RANK", "0"}, {"NNODES", "4"}, {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}}));
  CHECK(s.node_rank == 1);
  CHECK(s.nnodes == 2);
  // Other launchers: NODE_RANK and NNODES, and LOCAL_WORLD_SIZE is theirs to set.
  s = resolve_node_spec({}, env_of({{"NODE_RANK", "3"}, {"NNODES", "4"}, {"LOCAL_WORLD_SIZE", "8"}}));
  CHECK(s.node_rank == 3);
  CHECK(s.nnodes == 4);
  // Two torchrun processes per node would both be node GROUP_RANK.
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"GROUP_RANK", "0"}, {"WORLD_SIZE", "16"}, {"LOCAL_WORLD_SIZE", "8"}})),
                    Catch::Contains("LOCAL_WORLD_SIZE (torchrun)") && Catch::Contains("--nproc-per-node 1") &&
                        Catch::Contains("got 8"));
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"TORCHELASTIC_RUN_ID", "none"}, {"LOCAL_WORLD_SIZE", "2"}})),
                    Catch::Contains("LOCAL_WORLD_SIZE (torchrun)"));
  // The port after MASTER_PORT must exist.
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"MASTER_PORT", "65535"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})),
                    Catch::Contains("MASTER_PORT + 1") && Catch::Contains("expected a port in 1..65535, got 65536"));

  CHECK(resolve_node_spec({}, env_of({})).nnodes == 1);  // nothing given: one node
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"NODE_RANK", "3"}, {"NNODES", "2"}})),
                    Catch::Contains("NODE_RANK: expected a node rank in [0, 2), got 3 (the node count 2: from NNODES)"));
  // The node count by default (none given), and WORLD_SIZE that is no whole number of nodes.
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"NODE_RANK", "1"}})),
                    Catch::Contains("NODE_RANK: expected a node rank in [0, 1), got 1 (the node count 1: no --nnodes, "
                                    "NNODES, GROUP_WORLD_SIZE, WORLD_SIZE / LOCAL_WORLD_SIZE or SLURM_NNODES gave one)"));
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"WORLD_SIZE", "3"}, {"LOCAL_WORLD_SIZE", "2"}})),
                    Catch::Contains("WORLD_SIZE / LOCAL_WORLD_SIZE: 3 processes do not make whole nodes of 2"));
  CHECK(resolve_node_spec({}, env_of({{"WORLD_SIZE", "3"}, {"LOCAL_WORLD_SIZE", "2"}, {"NNODES", "3"}})).nnodes == 3);
  // WORLD_SIZE alone counts processes: each of them ran the whole job as node 0 of 1.
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}})),
                    Catch::Contains("WORLD_SIZE: 2 processes, but no node count") &&
                        Catch::Contains("expected --nnodes, NNODES, LOCAL_WORLD_SIZE beside WORLD_SIZE"));
  CHECK(resolve_node_spec({}, env_of({{"WORLD_SIZE", "1"}})).nnodes == 1);
  CHECK(resolve_node_spec({}, env_of({{"WORLD_SIZE", "4"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"}})).nnodes == 2);
  CHECK(resolve_node_spec({}, env_of({{"WORLD_SIZE", "4"}}), 2).nnodes == 2);  // a topology file counts them
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "0"}})),
                    Catch::Contains("LOCAL_WORLD_SIZE: expected a positive count of processes per node, got 0"));
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"MASTER_PORT", "http"}})),
                    Catch::Contains("MASTER_PORT: expected an integer"));
}

TEST_CASE("node spec: the first host of a Slurm node list, and each node's ranks", "[launch]") {
  CHECK(first_slurm_host("node[01-04,07],gpu2") == "node01");
  CHECK(first_slurm_host("a,b,c") == "a");
  CHECK(first_slurm_host("gpu-[3,5]") == "gpu-3");
  CHECK(first_slurm_host("solo") == "solo");
  // Text after a bracket group stays; groups multiply out with the first of each first.
  CHECK(first_slurm_host("host-[1-2]-ib") == "host-1-ib");
  CHECK(first_slurm_host("a[1-2]b[3-4]") == "a1b3");
  CHECK(first_slurm_host("rack[2]-n[010-012],other") == "rack2-n010");
  CHECK(first_slurm_host("gpu[07,01-03]") == "gpu07");
  for (const char* bad : {"bad[1", "node[1-", "node]1", "node[a-b]", "node[]", "[-3]x", ",a", ""}) {
    INFO(bad);
    CHECK_THROWS_WITH(first_slurm_host(bad), Catch::StartsWith(std::string("SLURM_JOB_NODELIST: malformed '") + bad + "'"));
  }
  // With a topology's node list: the count defaults to it, and Slurm's list is not read (the
  // topology names node 0).
  CHECK(resolve_node_spec({}, env_of({{"SLURM_JOB_NODELIST", "node[1-"}}), 2).nnodes == 2);
  CHECK_THROWS_WITH(resolve_node_spec({}, env_of({{"NODE_RANK", "2"}}), 2),
                    Catch::Contains("NODE_RANK: expected a node rank in [0, 2), got 2 (the node count 2: from topology.nodes)"));
  // A list that MASTER_ADDR overrides is not read.
  CHECK(resolve_node_spec({}, env_of({{"SLURM_JOB_NODELIST", "node[1-"}, {"MASTER_ADDR", "10.0.0.1"}})).master_addr ==
        "10.0.0.1");
  CHECK(node_ranks(8, 2, 1) == std::vector<int>{4, 5, 6, 7});
  CHECK(node_ranks(4, 4, 0) == std::vector<int>{0});
  CHECK_THROWS_WITH(node_ranks(6, 4, 0), Catch::Contains("4 nodes cannot split a 6-rank mesh evenly"));
}

TEST_CASE("node spec: a topology's node list places each node, flags win, variables give the node rank only", "[launch]") {
  const std::vector<NodeEntry> nodes = {{"alpha", 29600, 1}, {"beta", 29500, 3}};
  NodePlacement p = place_node(nodes, 4, resolve_node_spec({}, env_of({}), 2), "beta");
  CHECK(p.spec.node_rank == 1);  // by host name
  CHECK(p.spec.nnodes == 2);
  CHECK(p.spec.master_addr == "alpha");
  CHECK(p.spec.master_port == 29600);
  CHECK(p.spec.source() == "topology.nodes");  // named in rendezvous errors
  CHECK(p.ranks == std::vector<int>{1, 2, 3});
  CHECK(p.all.front() == std::vector<int>{0});

  NodeFlags flags;
  flags.node_rank = 0;
  flags.master_port = 4000;
  p = place_node(nodes, 4, resolve_node_spec(flags, env_of({}), 2), "elsewhere");
  CHECK(p.spec.node_rank == 0);
  CHECK(p.spec.master_port == 4000);
  CHECK(p.ranks == std::vector<int>{0});

  // torchrun sets MASTER_ADDR and MASTER_PORT always; Slurm lists its own hosts: the topology's
  // node 0 stands, and the node rank comes from the variables.
  const auto torchrun = env_of({{"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "1"},
                                {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "1234"},
                                {"SLURM_JOB_NODELIST", "gpu[07-10]"}});
  p = place_node(nodes, 4, resolve_node_spec({}, torchrun, 2), "elsewhere");
  CHECK(p.spec.node_rank == 1);
  CHECK(p.spec.master_addr == "alpha");
  CHECK(p.spec.master_port == 29600);
  CHECK(p.spec.source() == "GROUP_RANK (torchrun), GROUP_WORLD_SIZE (torchrun), topology.nodes");
  // torchrun's agent store holds MASTER_PORT: a topology naming that port takes the next, as without one.
  const auto agent_store = env_of({{"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"MASTER_PORT", "29600"},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  p = place_node(nodes, 4, resolve_node_spec({}, agent_store, 2), "elsewhere");
  CHECK(p.spec.master_port == 29601);
  CHECK_THAT(p.spec.source(), Catch::Contains("topology.nodes + 1 (torchrun's agent store holds its port)"));
  NodeFlags addr_flag;
  addr_flag.master_addr = "10.1.1.1";
  p = place_node(nodes, 4, resolve_node_spec(addr_flag, torchrun, 2), "elsewhere");
  CHECK(p.spec.master_addr == "10.1.1.1");
  CHECK(p.spec.master_port == 29600);

  CHECK_THROWS_WITH(place_node(nodes, 8, resolve_node_spec(flags, env_of({}), 2), "alpha"),
                    Catch::Contains("the nodes' ranks add up to 4, the mesh has 8"));
  auto typo = nodes;  // checked before any rank list is built (10^10 ranks would exhaust memory)
  typo.back().ranks = 10000000000;
  CHECK_THROWS_WITH(place_node(typo, 4, resolve_node_spec(flags, env_of({}), 2), "alpha"),
                    Catch::Contains("the nodes' ranks add up to 10000000001, the mesh has 4"));
  CHECK_THROWS_WITH(place_node(nodes, 4, resolve_node_spec({}, env_of({}), 2), "gamma"),
                    Catch::Contains("no node has this machine's host name 'gamma'"));
  CHECK_THROWS_WITH(place_node(nodes, 4, resolve_node_spec({}, env_of({{"NNODES", "3"}}), 2), "alpha"),
                    Catch::Contains("the topology lists 2 nodes, NNODES says 3"));
}
