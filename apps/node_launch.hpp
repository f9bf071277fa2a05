// atoll-train's multi-process launch (topology.backend: ucx, issue 11): where this node sits
// (flags, torchrun's or Slurm's variables), its ranks, the rendezvous with the other nodes over
// TCP (job token from ATOLL_JOB_TOKEN or topology.job_token_file), the UCX engine factory for its
// ranks, and the channel that hands node 0's starting point to the other nodes.
#pragma once
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "graph/config.hpp"
#include "graph/launch/node_spec.hpp"
#include "graph/training/run.hpp"

namespace atl {

class ControlPlane;

struct NodeLaunch {
  NodeSpec spec;
  std::vector<int> ranks;  // this node's ranks of the mesh
  EngineFactory engine;  // an actor engine of this node's ranks over UCX
  // Heartbeats with the other nodes; a lost node stops this process (exit 1, naming the node and
  // its ranks). finish() after a successful run.
  std::shared_ptr<ControlPlane> control;
  // RunOptions::from_writer: node 0's starting point to every node, over UCX (broadcasts among
  // each node's first rank).
  StartHandOver from_node0;
};

// Where this process sits: the flags and variables (graph/launch/node_spec), placed on the
// topology's node list when there is one. ConfigError naming the flag, variable or key that does
// not fit (topology.nodes; topology.mesh: nodes that do not split the mesh).
NodePlacement place_this_node(const RunConfig& config, const NodeFlags& flags);

// Throws ConfigError (topology.job_token_file: no token, or a bad token file), or
// JobMismatch when another node runs a different job, RunStopped when stop_requested (a signal
// number, else 0) asks to stop during the rendezvous, std::runtime_error when the rendezvous
// fails. `log`: the rendezvous's and the control plane's messages.
NodeLaunch launch_node(const RunConfig& config, const NodePlacement& placed, std::ostream& log,
                       std::function<int()> stop_requested);

// "[node N] " for the nodes other than 0, "" for node 0: what their lines start with.
std::string node_prefix(int node_rank);

// An ostream that writes each line to `out` behind `prefix` ("[node 1] ").
std::unique_ptr<std::ostream> prefixed_stream(std::ostream& out, std::string prefix);

}  // namespace atl
