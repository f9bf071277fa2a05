// Where this process sits in a multi-process job (issue 11): its node rank, the node count and
// node 0's address, from explicit flags, torchrun's variables or Slurm's, in that order of
// precedence, each field taken from the first source that has it. Node n runs ranks
// [n W / N, (n+1) W / N) of a W-rank mesh.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/config.hpp"

namespace atl {

struct NodeFlags {  // atoll-train --node-rank, --nnodes, --master-addr, --master-port
  std::optional<int> node_rank, nnodes, master_port;
  std::optional<std::string> master_addr;
};

struct NodeSpec {
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where each field came from: a flag ("--node-rank"), a variable ("GROUP_WORLD_SIZE (torchrun)")
  // or "topology.nodes"; "" for a default.
  std::string node_rank_from, nnodes_from, master_addr_from, master_port_from;
  // The port torchrun's agent store holds (MASTER_PORT under TORCHELASTIC_USE_AGENT_STORE), which
  // the rendezvous must not take; 0 when none.
  int agent_store_port = 0;
  // Those origins, joined: "--node-rank, GROUP_WORLD_SIZE (torchrun), ..." ("" when all are defaults).
  std::string source() const;
};

// An environment lookup (std::getenv in the app, a map in tests).
using Environment = std::function<std::optional<std::string>(const std::string&)>;
Environment process_environment();

// Throws std::invalid_argument naming the flag or variable that is malformed or out of range
// (node rank outside [0, nnodes), a port outside 1..65535, torchrun starting more than one process
// per node).
// `topology_nodes`: the length of a topology's node list (0: none), the node count when no flag or
// variable gives one; with a list, node 0's address and port are the list's (place_node) unless
// flags give them: MASTER_ADDR, MASTER_PORT and Slurm's node list are not read.
NodeSpec resolve_node_spec(const NodeFlags& flags, const Environment& env, int topology_nodes = 0);

// Whether torchrun started this process (its elastic agent's variables are set).
bool under_torchrun(const Environment& env);

// The first host of a Slurm node list: "node[01-04,07],gpu2" -> "node01", "a[1-2]-ib" -> "a1-ib";
// std::invalid_argument naming the list when it is malformed.
std::string first_slurm_host(const std::string& nodelist);

// The ranks node `node_rank` of `nnodes` runs of a `world`-rank mesh; std::invalid_argument
// unless nnodes divides world.
std::vector<int> node_ranks(int world, int nnodes, int node_rank);

// Placement from a topology's node list (topology.nodes, in node order): the node count, node 0's
// host and port (--master-addr and --master-port win; variables do not: torchrun sets them always),
// each node's ranks in order of the list (their counts
// must add up to `world`). This node is the one the flags or variables name, else the one entry
// whose host is `hostname`. std::invalid_argument says what does not fit.
struct NodePlacement {
  NodeSpec spec;
  std::vector<int> ranks;  // this node's
  std::vector<std::vector<int>> all;  // every node's, for messages
};
NodePlacement place_node(const std::vector<NodeEntry>& nodes, int world, const NodeSpec& given,
                         const std::string& hostname);

}  // namespace atl
