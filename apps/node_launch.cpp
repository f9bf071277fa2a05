#include "apps/node_launch.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <streambuf>

#include "actors/actor_engine.hpp"
#include "comm/rendezvous/control_plane.hpp"
#include "comm/rendezvous/tcp_rendezvous.hpp"
#include "comm/ucx/ucx_backend.hpp"
#include "graph/data/data_source.hpp"
#include "graph/launch/job_token.hpp"
#include "graph/models/model.hpp"
#include "graph/plan/mesh.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"
#include "graph/training/run.hpp"
#include "kernels/rng.hpp"

namespace atl {

namespace {

// Node 0's starting point to every node: collectives among each node's first rank (`me`: this
// node's first rank).
StartHandOver hand_over_from_node0(const std::shared_ptr<UcxWorld>& world,
                                   const std::vector<std::vector<int>>& every_node, int me) {
  StartHandOver link;
  if (every_node.size() == 1) {  // one node: nobody to tell
    link.bytes = [](std::vector<std::byte> bytes) { return bytes; };
    link.tensor = [](const Tensor&) {};
    link.barrier = [] {};
    return link;
  }
  Group firsts{"nodes", {}};
  for (const auto& node : every_node) firsts.ranks.push_back(node.front());
  const bool root = firsts.ranks.front() == me;
  // The world's progress thread runs every transfer and stops with the world: the hand-over keeps it.
  std::shared_ptr<Communicator> comm(world->communicator(firsts, me).release(), [world](Communicator* c) { delete c; });
  link.tensor = [comm](const Tensor& t) {
    run_and_wait([&](Completion done) { comm->broadcast(t, 0, "start", std::move(done)); });
  };
  link.bytes = [root, tensor = link.tensor](std::vector<std::byte> bytes) {
    Tensor length = Tensor::empty({1}, DType::i64);
    length.data<std::int64_t>()[0] = root ? static_cast<std::int64_t>(bytes.size()) : 0;
    tensor(length);
    const std::int64_t n = length.data<std::int64_t>()[0];
    Tensor payload = Tensor::empty({std::max<std::int64_t>(1, (n + 7) / 8)}, DType::i64);  // whole words
    if (root) std::memcpy(payload.raw(), bytes.data(), bytes.size());
    tensor(payload);
    if (root) return bytes;
    const auto* data = static_cast<const std::byte*>(payload.raw());
    return std::vector<std::byte>(data, data + n);
  };
  link.barrier = [comm] {
    const Tensor zero = Tensor::zeros({1});
    run_and_wait([&](Completion done) { comm->all_reduce(zero, "start", std::move(done)); });
  };
  return link;
}

// What the nodes must agree on besides the config: where each rank runs (--nnodes and its
// sources can differ per node), the step program the plan makes (the collectives every rank
// posts, in order: a different atoll build could make another), and the UCX wire format.
nlohmann::json launch_description(const RunConfig& config, const Mesh& mesh,
                                  const std::vector<std::vector<int>>& every_node) {
  const std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  const Plan plan = make_plan(model->specs(), model->sharding_rules(), mesh, config.precision);
  const StepProgram program = compile_step_program(plan, model->ops(), micro_batches_per_rank(config, mesh),
                                                   config.train.schedule, config.topology.ep_dispatch);
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx",
                static_cast<unsigned long long>(stable_hash(step_program_json(plan, program))));
  return {{"placement", every_node}, {"step_program", digest}, {"ucx_wire_version", kUcxWireVersion}};
}

}  // namespace

std::string node_prefix(int node_rank) {
  return node_rank != 0 ? "[node " + std::to_string(node_rank) + "] " : std::string();
}

NodePlacement place_this_node(const RunConfig& config, const NodeFlags& flags) {
  NodeSpec spec;
  try {
    spec = resolve_node_spec(flags, process_environment(), static_cast<int>(config.topology.nodes.size()));
  } catch (const std::invalid_argument& e) {
    // (No key: the variable or flag named is the cause, not topology.backend.)
    throw ConfigError(config.source_file, "", std::string("ucx launch: ") + e.what());
  }
  const Mesh mesh(config.topology.mesh, config.source_file);
  if (!config.topology.nodes.empty()) {  // a topology file lists the nodes
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    try {
      return place_node(config.topology.nodes, mesh.world_size(), spec, host);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(config.source_file, "topology.nodes", e.what());
    }
  }
  NodePlacement placed;
  placed.spec = spec;
  try {
    for (int n = 0; n < spec.nnodes; ++n) placed.all.push_back(node_ranks(mesh.world_size(), spec.nnodes, n));
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.source_file, "topology.mesh",
                      std::string(e.what()) + " (the node count from " + spec.nnodes_from +
                          "); topology.nodes gives each node its own number of ranks");
  }
  placed.ranks = placed.all[static_cast<std::size_t>(spec.node_rank)];
  return placed;
}

namespace {

// The job token every connection must show: ATOLL_JOB_TOKEN or topology.job_token_file (required
// with more than one node). Its warning, if any, goes to `log`.
std::string node_job_token(const RunConfig& config, const NodeSpec& spec, std::ostream& log) {
  JobToken token;
  try {
    token = resolve_job_token(config.topology.job_token_file, process_environment()("ATOLL_JOB_TOKEN"));
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.source_file, "topology.job_token_file", e.what());
  }
  if (!token.warning.empty()) {
    log << (node_prefix(spec.node_rank) + "atoll-train: warning: " + token.warning + "\n") << std::flush;
  }
  if (spec.nnodes > 1 && !token.token) {
    throw ConfigError(config.source_file, "topology.job_token_file",
                      "a multi-node ucx job needs a job token: ATOLL_JOB_TOKEN (scripts/launch generates one) or "
                      "a file named here");
  }
  return token.token.value_or("");
}

// The job as the nodes compare it at the rendezvous: the resolved config less what may differ
// between nodes, plus the launch (placement, step program, wire version).
nlohmann::json job_description(const RunConfig& config, const Mesh& mesh, const std::vector<std::vector<int>>& every_node) {
  nlohmann::json job = to_json(config);
  // Nodes may name the same config, and the same token, by different paths.
  job.erase("source_file");
  job["topology"].erase("job_token_file");
  // checkpoint.dir as run_dir implies it: a differing run_dir is named as itself, not as the
  // checkpoint.dir it implies (the first differing key comes in key order).
  if (config.checkpoint.dir == default_checkpoint_dir(config.run_dir)) {
    job["checkpoint"].erase("dir");
  }
  job["launch"] = launch_description(config, mesh, every_node);
  return job;
}

// A differing job, with what the differing key means for the user where it is not plain. Called
// in a handler of `e`.
[[noreturn]] void explain_mismatch(const JobMismatch& e, const RunConfig& config, const NodeSpec& spec) {
  if (e.key().rfind("launch.placement", 0) == 0) {
    throw JobMismatch(e.key(), std::string(e.what()) + " (the nodes place the ranks differently: every node needs the "
                                   "same --nnodes, NNODES or SLURM_NNODES, and topology.nodes; node " +
                                   std::to_string(spec.node_rank) + " runs " + std::to_string(spec.nnodes) +
                                   " nodes, placed by " + (spec.source().empty() ? "defaults" : spec.source()) + ")");
  }
  if (e.key() == "launch.step_program" || e.key() == "launch.ucx_wire_version") {
    throw JobMismatch(e.key(), std::string(e.what()) + " (the same config gives the nodes different " +
                                   (e.key() == "launch.step_program" ? "step programs" : "UCX message formats") +
                                   ": they run different atoll builds)");
  }
  if (e.key() == "data.content_hash") {
    throw JobMismatch(e.key(), std::string(e.what()) + " (the nodes' copies of " + config.data.path +
                                   " differ, or one cannot be read and its node names why: every node must read the same bytes)");
  }
  throw;  // (called in the handler of `e`: rethrows it as it is)
}

// A transfer that fails with every process alive (the data network broke, the control
// connections did not) would leave every node waiting: stop once a lost node would have been
// named by then (a node that died is, within topology.heartbeat_timeout_s). Processes that
// disagree about a collective run different builds or plans: exit 2, a restart cannot help.
void stop_on_failed_transfers(UcxWorld& world, const RunConfig& config, int node) {
  const double grace_s = config.topology.heartbeat_timeout_s + 10;
  world.on_transfer_failure(std::chrono::milliseconds(static_cast<std::int64_t>(grace_s * 1000)),
                            [node, grace_s](TransferFailure kind) {
                              const std::string prefix = node_prefix(node);
                              if (kind == TransferFailure::disagreement) {
                                std::fprintf(stderr,
                                             "%satoll-train: the nodes disagree about a collective (see the message "
                                             "above): they run different atoll builds or plans; stopping\n",
                                             prefix.c_str());
                                std::fflush(stderr);
                                std::_Exit(2);
                              }
                              std::fprintf(stderr,
                                           "%satoll-train: a UCX transfer failed %.0f s ago (see the message above) "
                                           "and no node was lost: the data network between the nodes failed while "
                                           "their control connections stayed up; stopping\n",
                                           prefix.c_str(), grace_s);
                              std::fflush(stderr);
                              std::_Exit(1);
                            });
}

// What this node does when the control plane reports another node lost, ending the job, or done.
ControlPlaneSettings control_plane_settings(const RunConfig& config, int me, const std::shared_ptr<UcxWorld>& world,
                                            const std::vector<std::vector<int>>& every_node, std::ostream& log) {
  ControlPlaneSettings control;
  control.node_rank = me;
  control.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.topology.heartbeat_timeout_s * 1000));
  control.on_lost = [&log, every_node, me](int node, const std::string& why) {
    const std::vector<int>& lost = every_node.at(static_cast<std::size_t>(node));
    log << node_prefix(me) << "atoll-train: node " << me << ": lost node " << node << " (ranks " << lost.front() << ".." << lost.back()
        << "): " << why << "; stopping\n"
        << std::flush;
    std::_Exit(1);  // the collectives in flight would wait forever; checkpoints are written atomically
  };
  // A node that ended the job with a code of its own (node 0's non-finite weights at a save):
  // every node exits with it, so a launcher reads the job's end alike from any node.
  control.on_abort = [&log, me](int node, int exit_code, const std::string& why) {
    log << (node_prefix(me) + "atoll-train: node " +
            std::to_string(node) + " ended the job (exit " + std::to_string(exit_code) + "): " + why + "\n")
        << std::flush;
    std::_Exit(exit_code);
  };
  // A node that finished closes its UCX endpoints while others may still save: not a failure.
  control.on_goodbye = [world, every_node](int node) {
    world->said_goodbye(every_node.at(static_cast<std::size_t>(node)));
  };
  // Every other node may end now (a star: not all say so here), but what this node sent them is
  // still flushed at its end: its last sends may still be on their way.
  control.on_ending = [world, every_node, me] {
    for (std::size_t n = 0; n < every_node.size(); ++n) {
      if (static_cast<int>(n) != me) world->expect_end(every_node[n]);
    }
  };
  return control;
}

}  // namespace

NodeLaunch launch_node(const RunConfig& config, const NodePlacement& placed, std::ostream& log,
                       std::function<int()> stop_requested) {
  NodeLaunch launch;
  launch.spec = placed.spec;
  const std::vector<int>& ranks = placed.ranks;
  const std::vector<std::vector<int>>& every_node = placed.all;  // each node's ranks (messages about a lost node)
  const Mesh mesh(config.topology.mesh, config.source_file);
  const NodeSpec& spec = launch.spec;
  const std::string token = node_job_token(config, spec, log);
  // (No history of collectives: the engine counts each step's traffic from its tap.)
  auto world = std::make_shared<UcxWorld>(mesh.world_size(), ranks, CollectiveRecorder::without_history(),
                                          config.topology.ucx_peer_errors);
  world->set_message_prefix(node_prefix(spec.node_rank));
  nlohmann::json job = job_description(config, mesh, every_node);
  // Nodes read their own copies of a data file (no shared file system needed): the copies must
  // hold the same bytes. A node that cannot read its copy says so after the rendezvous, where the
  // others learn of it as a differing job (not as a node that never came).
  std::exception_ptr unreadable_data;
  try {
    if (spec.nnodes > 1) {  // (a second pass over the file: only where there is another copy to compare)
      if (const auto hash = data_content_hash(config.data, config.source_file)) job["data"]["content_hash"] = *hash;
    }
  } catch (const DataError& e) {
    unreadable_data = std::current_exception();
    job["data"]["content_hash"] = std::string("unreadable: ") + e.what();
  }
  RendezvousSettings settings;
  settings.master_addr = spec.master_addr;
  settings.master_port = spec.master_port;
  settings.node_rank = spec.node_rank;
  settings.nnodes = spec.nnodes;
  settings.token = token;
  settings.job = job.dump();
  settings.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(config.topology.rendezvous_timeout_s * 1000));
  settings.log = [&log](const std::string& message) { log << "rendezvous: " << message << "\n" << std::flush; };
  settings.stop_requested = std::move(stop_requested);
  RendezvousLinks links;
  std::map<int, WorkerAddress> addresses;
  try {
    addresses = rendezvous(settings, world->local_addresses(), &links);
  } catch (const RendezvousStopped& e) {  // before any step: nothing was written
    throw RunStopped(e.signal(), "stopped by " + stop_signal_name(e.signal()) +
                                     " while waiting for the other nodes at the rendezvous; nothing was written");
  } catch (const JobMismatch& e) {
    if (unreadable_data) std::rethrow_exception(unreadable_data);  // its own reason, not the mismatch
    explain_mismatch(e, config, spec);
  } catch (const std::runtime_error& e) {  // say where node 0's address and port came from
    throw std::runtime_error(std::string(e.what()) + " [node " + std::to_string(spec.node_rank) + " of " +
                             std::to_string(spec.nnodes) + ", placed by " +
                             (spec.source().empty() ? std::string("defaults") : spec.source()) + "]");
  }
  if (unreadable_data) std::rethrow_exception(unreadable_data);  // every node's copy fails alike
  world->connect(addresses);
  world->name_ranks([every_node](int rank) {
    for (std::size_t n = 0; n < every_node.size(); ++n) {
      const auto& r = every_node[n];
      if (std::find(r.begin(), r.end(), rank) != r.end()) return "rank " + std::to_string(rank) + " (node " + std::to_string(n) + ")";
    }
    return "rank " + std::to_string(rank);
  });
  stop_on_failed_transfers(*world, config, spec.node_rank);
  launch.control = std::make_shared<ControlPlane>(control_plane_settings(config, spec.node_rank, world, every_node, log),
                                                  std::move(links));
  launch.from_node0 = hand_over_from_node0(world, every_node, ranks.front());
  launch.ranks = ranks;
  launch.engine = [world, ranks](EngineInputs in) -> std::unique_ptr<TrainingEngine> {
    return std::make_unique<ActorEngine>(std::move(in), ProcessOptions{ranks, std::make_shared<UcxBackend>(world)});
  };
  return launch;
}

namespace {

// Collects a line and writes it whole behind the prefix: nodes sharing one stderr do not
// interleave character by character.
class PrefixedBuffer : public std::streambuf {
 public:
  PrefixedBuffer(std::ostream& out, std::string prefix) : out_(out), prefix_(std::move(prefix)) {}

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    line_.push_back(static_cast<char>(c));
    if (c == '\n') flush_line();
    return c;
  }
  int sync() override {
    if (!line_.empty()) flush_line();
    out_.flush();
    return 0;
  }

 private:
  void flush_line() {  // a flush mid-line writes what there is; the prefix only at a line's start
    const std::string whole = (at_line_start_ ? prefix_ : std::string()) + line_;
    out_.write(whole.data(), static_cast<std::streamsize>(whole.size()));
    out_.flush();
    at_line_start_ = line_.back() == '\n';
    line_.clear();
  }

  std::ostream& out_;
  std::string prefix_;
  std::string line_;
  bool at_line_start_ = true;
};

class PrefixedStream : public std::ostream {
 public:
  PrefixedStream(std::ostream& out, std::string prefix) : std::ostream(nullptr), buffer_(out, std::move(prefix)) {
    rdbuf(&buffer_);
  }

 private:
  PrefixedBuffer buffer_;
};

}  // namespace

std::unique_ptr<std::ostream> prefixed_stream(std::ostream& out, std::string prefix) {
  return std::make_unique<PrefixedStream>(out, std::move(prefix));
}

}  // namespace atl
