#include "graph/launch/node_spec.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace atl {

namespace {

int parse_int(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw std::invalid_argument(what + ": expected an integer, got '" + text + "'");
  return value;
}

// The first source that has a field: flags, then torchrun's variables, then Slurm's.
template <class T>
struct Field {
  std::optional<T> value;
  std::string from;
  void offer(const std::optional<T>& v, const std::string& source) {
    if (!value && v) {
      value = v;
      from = source;
    }
  }
};

}  // namespace

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

std::string first_slurm_host(const std::string& nodelist) {
  auto malformed = [&](const std::string& why) {
    return std::invalid_argument("SLURM_JOB_NODELIST: malformed '" + nodelist + "' (" + why + ")");
  };
  // The first host expression (up to a ',' outside brackets); each bracket group in it is a list of
  // numbers and ranges whose first number is the first host's ("a[1-2]b[3-4]-ib" starts a1b3-ib).
  std::string host;
  for (std::size_t i = 0; i < nodelist.size() && nodelist[i] != ',';) {
    if (nodelist[i] == ']') throw malformed("a ']' without its '['");
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const std::size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw malformed("a '[' without its ']'");
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    if (group.find_first_not_of("0123456789-,") != std::string::npos) {
      throw malformed("expected numbers and ranges inside [...], got '" + group + "'");
    }
    const std::string first = group.substr(0, group.find_first_of("-,"));
    if (first.empty()) throw malformed("expected a number first inside [...], got '" + group + "'");
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw malformed("no host before the first ','");
  return host;
}

bool under_torchrun(const Environment& env) { return env("TORCHELASTIC_RUN_ID") || env("GROUP_RANK"); }

NodeSpec resolve_node_spec(const NodeFlags& flags, const Environment& env, int topology_nodes) {
  auto integer = [&](const char* name) -> std::optional<int> {
    if (auto v = env(name)) return parse_int(*v, name);
    return std::nullopt;
  };
  Field<int> node, nnodes, port;
  Field<std::string> addr;
  node.offer(flags.node_rank, "--node-rank");
  nnodes.offer(flags.nnodes, "--nnodes");
  port.offer(flags.master_port, "--master-port");
  addr.offer(flags.master_addr, "--master-addr");
  // torchrun (checked with torch 2.15): GROUP_RANK and GROUP_WORLD_SIZE are the node's rank and
  // the node count as its rendezvous assigned them (c10d ignores --node-rank), so they come before
  // a NODE_RANK or NNODES the script may also export. atoll-train is one process per node running
  // all its ranks: a second torchrun worker per node would claim the same node rank.
  const bool torchrun = under_torchrun(env);
  if (auto local = integer("LOCAL_WORLD_SIZE"); torchrun && local && *local != 1) {
    throw std::invalid_argument("LOCAL_WORLD_SIZE (torchrun): atoll-train runs one process per node, which runs the "
                                "node's ranks; expected 1 (torchrun --nproc-per-node 1), got " + std::to_string(*local));
  }
  node.offer(integer("GROUP_RANK"), "GROUP_RANK (torchrun)");
  nnodes.offer(integer("GROUP_WORLD_SIZE"), "GROUP_WORLD_SIZE (torchrun)");
  // Other launchers (and people) export NODE_RANK and NNODES.
  node.offer(integer("NODE_RANK"), "NODE_RANK");
  nnodes.offer(integer("NNODES"), "NNODES");
  if (auto local = integer("LOCAL_WORLD_SIZE"); local && *local < 1) {
    throw std::invalid_argument("LOCAL_WORLD_SIZE: expected a positive count of processes per node, got " +
                                std::to_string(*local));
  }
  if (auto world = integer("WORLD_SIZE"), local = integer("LOCAL_WORLD_SIZE"); world && local) {
    if (!nnodes.value && *world % *local != 0) {
      throw std::invalid_argument("WORLD_SIZE / LOCAL_WORLD_SIZE: " + std::to_string(*world) + " processes do not "
                                  "make whole nodes of " + std::to_string(*local) + "; expected a multiple (or NNODES)");
    }
    nnodes.offer(*world / *local, "WORLD_SIZE / LOCAL_WORLD_SIZE");
  }
  // A topology's node 0 names the rendezvous (place_node): the topology is this job's own file,
  // while MASTER_ADDR and MASTER_PORT (torchrun sets them always) or Slurm's node list describe
  // whatever launched the process. Only the flags override it.
  const bool topology = topology_nodes > 0;
  if (!topology) addr.offer(env("MASTER_ADDR"), "MASTER_ADDR");
  // torchrun's agent on node 0 serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE):
  // atoll's rendezvous takes the next port, the same on every node. (With c10d rendezvous
  // MASTER_PORT is one the OS picked and its successor may be taken: --master-port is surer.)
  std::optional<int> agent_store_port;
  if (auto agent_store = env("TORCHELASTIC_USE_AGENT_STORE"); agent_store && (*agent_store == "True" || *agent_store == "1")) {
    agent_store_port = integer("MASTER_PORT");
    if (agent_store_port && !topology) {
      port.offer(*agent_store_port + 1, "MASTER_PORT + 1 (torchrun's agent store holds MASTER_PORT)");
    }
  }
  if (!topology) port.offer(integer("MASTER_PORT"), "MASTER_PORT");
  // Slurm: SLURM_NODEID, SLURM_NNODES, the first host of SLURM_JOB_NODELIST.
  node.offer(integer("SLURM_NODEID"), "SLURM_NODEID (Slurm)");
  nnodes.offer(integer("SLURM_NNODES"), "SLURM_NNODES (Slurm)");
  // (Read only when it decides: a list that a flag, MASTER_ADDR or a topology overrides is not parsed.)
  if (auto list = env("SLURM_JOB_NODELIST"); list && !addr.value && !topology) {
    addr.offer(first_slurm_host(*list), "SLURM_JOB_NODELIST (Slurm)");
  }

  // WORLD_SIZE alone counts processes, not nodes (a launcher of one process per rank): taken for
  // one node, every process would run the whole job and write run_dir.
  if (auto world = integer("WORLD_SIZE"); world && *world > 1 && !nnodes.value && !topology) {
    throw std::invalid_argument("WORLD_SIZE: " + std::to_string(*world) + " processes, but no node count (atoll-train "
                                "runs one process per node, which runs the node's ranks); expected --nnodes, NNODES, "
                                "LOCAL_WORLD_SIZE beside WORLD_SIZE, SLURM_NNODES or topology.nodes");
  }
  NodeSpec spec;
  spec.nnodes = std::max(1, topology_nodes);
  spec.node_rank_from = node.from;
  spec.nnodes_from = nnodes.from;
  spec.master_addr_from = addr.from;
  spec.master_port_from = port.from;
  spec.agent_store_port = agent_store_port.value_or(0);
  if (nnodes.value) spec.nnodes = *nnodes.value;
  if (node.value) spec.node_rank = *node.value;
  if (addr.value) spec.master_addr = *addr.value;
  if (port.value) spec.master_port = *port.value;
  if (spec.nnodes < 1) throw std::invalid_argument(nnodes.from + ": expected a positive node count");
  if (spec.node_rank < 0 || spec.node_rank >= spec.nnodes) {
    const std::string count_from = !nnodes.from.empty() ? "from " + nnodes.from
                                   : topology_nodes > 0 ? std::string("from topology.nodes")
                                                        : "no --nnodes, NNODES, GROUP_WORLD_SIZE, WORLD_SIZE / "
                                                          "LOCAL_WORLD_SIZE or SLURM_NNODES gave one";
    throw std::invalid_argument((node.from.empty() ? std::string("the node rank") : node.from) + ": expected a node rank in [0, " +
                                std::to_string(spec.nnodes) + "), got " + std::to_string(spec.node_rank) + " (the node count " +
                                std::to_string(spec.nnodes) + ": " + count_from + ")");
  }
  if (spec.master_port < 1 || spec.master_port > 65535) {
    throw std::invalid_argument(port.from + ": expected a port in 1..65535, got " + std::to_string(spec.master_port));
  }
  return spec;
}

std::string NodeSpec::source() const {
  std::vector<std::string> origins;  // each once ("topology.nodes" gives both address and port)
  for (const std::string* from : {&node_rank_from, &nnodes_from, &master_addr_from, &master_port_from}) {
    if (!from->empty() && std::find(origins.begin(), origins.end(), *from) == origins.end()) origins.push_back(*from);
  }
  return fmt::format("{}", fmt::join(origins, ", "));
}

std::vector<int> node_ranks(int world, int nnodes, int node_rank) {
  if (nnodes < 1 || world % nnodes != 0) {
    throw std::invalid_argument(std::to_string(nnodes) + " nodes cannot split a " + std::to_string(world) +
                                "-rank mesh evenly");
  }
  const int per = world / nnodes;
  std::vector<int> out;
  for (int r = node_rank * per; r < (node_rank + 1) * per; ++r) out.push_back(r);
  return out;
}

NodePlacement place_node(const std::vector<NodeEntry>& nodes, int world, const NodeSpec& given,
                         const std::string& hostname) {
  NodePlacement p;
  p.spec = given;
  const int n = static_cast<int>(nodes.size());
  if (!given.nnodes_from.empty() && given.nnodes != n) {
    throw std::invalid_argument("the topology lists " + std::to_string(n) + " nodes, " + given.nnodes_from + " says " +
                                std::to_string(given.nnodes));
  }
  std::int64_t total = 0;  // checked before any list is built: a typo can be 10^10 ranks
  for (const NodeEntry& e : nodes) total += e.ranks;
  if (total != world) {
    throw std::invalid_argument("the nodes' ranks add up to " + std::to_string(total) + ", the mesh has " +
                                std::to_string(world));
  }
  int next = 0;
  for (const NodeEntry& e : nodes) {
    std::vector<int> ranks(static_cast<std::size_t>(e.ranks));
    for (int& r : ranks) r = next++;
    p.all.push_back(std::move(ranks));
  }
  p.spec.nnodes = n;
  // Node 0's host and port as the topology lists them, unless a flag gave them (resolve_node_spec
  // reads no variable for them when there is a topology).
  if (given.master_addr_from.empty()) {
    p.spec.master_addr = nodes.front().host;
    p.spec.master_addr_from = "topology.nodes";
  }
  if (given.master_port_from.empty()) {
    p.spec.master_port = static_cast<int>(nodes.front().port);
    p.spec.master_port_from = "topology.nodes";
    // Under torchrun, its agent store may hold that very port (MASTER_PORT): the next one, as without a topology.
    if (p.spec.master_port == given.agent_store_port) {
      p.spec.master_port += 1;
      p.spec.master_port_from = "topology.nodes + 1 (torchrun's agent store holds its port)";
    }
  }
  if (given.node_rank_from.empty()) {
    int match = -1, matches = 0;
    for (int i = 0; i < n; ++i) {
      if (nodes[static_cast<std::size_t>(i)].host == hostname) {
        match = i;
        ++matches;
      }
    }
    if (matches != 1) {
      throw std::invalid_argument(std::string(matches == 0 ? "no" : "more than one") + " node has this machine's host name '" +
                                  hostname + "'; give --node-rank (or NODE_RANK)");
    }
    p.spec.node_rank = match;
  }
  if (p.spec.node_rank < 0 || p.spec.node_rank >= n) {
    throw std::invalid_argument("node rank " + std::to_string(p.spec.node_rank) + " is not one of the topology's " +
                                std::to_string(n) + " nodes");
  }
  p.ranks = p.all[static_cast<std::size_t>(p.spec.node_rank)];
  return p;
}

}  // namespace atl
