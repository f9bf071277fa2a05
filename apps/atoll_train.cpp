// atoll-train CONFIG.yaml [--set key.path=value ...]: train a model as the config says.
// With topology.backend: ucx, one atoll-train runs per node (--node-rank/--nnodes/--master-addr/
// --master-port, or torchrun's or Slurm's variables; scripts/launch starts them on one machine).
// Exit codes: 0 done, 2 bad config or command line (nothing written; nodes running different
// jobs), 3 a non-finite loss or gradient, 143 / 130 stopped by SIGTERM / SIGINT after saving
// (docs/failures.md), 1 failure while running.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <new>

#include <CLI/CLI.hpp>

#include "actors/actor_engine.hpp"
#include "apps/cli_checks.hpp"
#include "apps/end_message.hpp"
#include "apps/fatal_exit.hpp"
#include "apps/node_launch.hpp"
#include "comm/rendezvous/control_plane.hpp"
#include "comm/rendezvous/tcp_rendezvous.hpp"
#include "apps/graceful_stop.hpp"
#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/config.hpp"
#include "graph/data/data_source.hpp"
#include "graph/launch/node_spec.hpp"
#include "graph/training/exit_code.hpp"
#include "graph/training/output_path.hpp"
#include "graph/training/run.hpp"
#include "graph/training/starting_point.hpp"
#include "kernels/cpu/cpu_features.hpp"

namespace {

// torchrun starts this same command on every node: with any backend but ucx each would run the
// whole job and write run_dir. (Slurm's variables are in every step of an allocation, so they
// alone say nothing.)
void refuse_torchrun_nodes(const atl::RunConfig& config) {
  const atl::Environment env = atl::process_environment();
  if (!atl::under_torchrun(env)) return;
  atl::NodeSpec spec;
  try {
    spec = atl::resolve_node_spec({}, env);
  } catch (const std::invalid_argument& e) {
    throw atl::ConfigError(config.source_file, "topology.backend", std::string("torchrun's variables: ") + e.what());
  }
  if (spec.nnodes > 1) {
    throw atl::ConfigError(config.source_file, "topology.backend",
                           "torchrun started this process as node " + std::to_string(spec.node_rank) + " of " +
                               std::to_string(spec.nnodes) + " (" + spec.source() + "), but " +
                               atl::backend_name(config.topology.backend) +
                               " runs the whole job in each process; expected ucx (--set topology.backend=ucx)");
  }
}

// One node of a ucx job: placed, joined at the rendezvous, then its share of the run. `prefix`
// becomes "[node N] " for nodes other than 0 (the caller's messages use it too).
void train_as_node(const atl::RunConfig& config, const atl::NodeFlags& node, const atl::RunOptions& options,
                   const std::vector<std::string>& sets, std::string& prefix) {
  const atl::NodePlacement placed = atl::place_this_node(config, node);
  prefix = atl::node_prefix(placed.spec.node_rank);  // from here on, even for a placement by Slurm or host name
  atl::exit_on_escaped_exception(prefix + "atoll-train");
  atl::RunOptions node_options = options;  // holds the launch's hand-over: gone with the launch
  if (!options.trace_path.empty() && placed.spec.node_rank != 0) {  // (node 0's is checked with its outputs)
    node_options.trace_path = atl::node_trace_path(options.trace_path, placed.spec.node_rank);
    atl::check_output_path(node_options.trace_path, true, config.source_file, "--trace");
  }
  const atl::NodeLaunch launch = atl::launch_node(config, placed, std::cerr, options.stop_requested);
  // Node 0 writes the run; the others print to stderr behind their node rank.
  node_options.writer = launch.spec.node_rank == 0;
  node_options.ranks_here = static_cast<int>(launch.ranks.size());
  // Node 0 alone reads the checkpoint to start from; when it cannot, every node stops.
  bool start_failed = false;
  node_options.from_writer = launch.from_node0;
  node_options.from_writer->bytes = [&start_failed, &launch](std::vector<std::byte> bytes) {
    std::vector<std::byte> got = launch.from_node0.bytes(std::move(bytes));
    start_failed = atl::is_start_failure(got);
    return got;
  };
  auto node_out = atl::prefixed_stream(std::cerr, prefix);
  // Ends every node agrees on (done, a stop every node takes after the same step, a
  // non-finite step every node sees) say goodbye, so the other nodes do not count this one
  // as lost while they finish; any other end closes the control channel like a crash.
  try {
    atl::run_training(config, node_options, launch.engine, node_options.writer ? std::cout : *node_out);
  } catch (const atl::RunStopped&) {
    launch.control->finish();
    throw;
  } catch (const atl::DivergedWeights& e) {  // node 0's alone: every node ends with its exit code
    launch.control->abort(atl::exit_code_for(e), atl::end_message(e, sets));
    throw;
  } catch (const atl::NonFiniteError&) {
    launch.control->finish();
    throw;
  } catch (const atl::RunFinished&) {  // every node finds the data used up at the same step
    launch.control->finish();
    throw;
  } catch (const std::exception& e) {
    if (start_failed) {
      launch.control->finish();  // every node knows: an agreed end
    } else if (atl::exit_code_for(e) == 2) {
      // Bad input this node alone met (its copy of the data file changed, say): every node
      // exits 2 with its message, not 1 for a lost node, which a launcher would restart.
      launch.control->abort(2, atl::end_message(e, sets));
    }
    throw;
  }
  launch.control->finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"atoll-train: train a Mixture-of-Experts transformer (simulation mode runs the whole mesh here)"};
  std::string config_path;
  std::vector<std::string> sets;
  atl::RunOptions options;
  app.add_option("config", config_path, "YAML run config (see docs/config.md)")->required()->check(atl::non_empty_path());
  app.add_option("--set", sets, "override a config key: --set train.steps=50 (repeatable)");
  app.add_flag("--overwrite", options.overwrite, "replace the outputs of an earlier run in run_dir");
  app.add_option("--trace", options.trace_path, "write a Chrome trace-event JSON of every actor's spans (Perfetto)")
      ->check(atl::non_empty_path());
  std::string resume_from;
  auto* resume = app.add_option("--resume", resume_from,
                                "continue from a checkpoint: its directory, or with no value the latest complete "
                                "one under checkpoint.dir")
                     ->expected(0, 1);
  auto* resume_if_any = app.add_flag("--resume-if-any", options.resume_if_any,
                                     "continue from the latest complete checkpoint under checkpoint.dir if there is "
                                     "one, else start fresh (what scripts/launch --max-restarts uses)");
  resume_if_any->excludes(resume);
  atl::NodeFlags node;
  // The variables in their order of precedence (graph/launch/node_spec.cpp; docs/runtime.md).
  app.add_option("--node-rank", node.node_rank, "ucx: this node's rank (else GROUP_RANK, NODE_RANK or SLURM_NODEID)");
  app.add_option("--nnodes", node.nnodes,
                 "ucx: the number of nodes (else GROUP_WORLD_SIZE, NNODES, WORLD_SIZE / LOCAL_WORLD_SIZE or "
                 "SLURM_NNODES)");
  app.add_option("--master-addr", node.master_addr, "ucx: node 0's address (else MASTER_ADDR or Slurm's first host)");
  app.add_option("--master-port", node.master_port,
                 "ucx: node 0's rendezvous port (else MASTER_PORT, plus 1 beside torchrun's agent store; 29500)");
  // `--resume ''` (an unset variable: --resume "$DIR") would read as the bare flag, the latest
  // checkpoint: CLI11 gives both the same empty value, so the words are looked at here.
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--resume=" || (word == "--resume" && i + 1 < argc && argv[i + 1][0] == '\0')) {
      std::cerr << "atoll-train: --resume: expected a checkpoint directory, got '' (--resume alone resumes the latest "
                   "under checkpoint.dir)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints help or the usage error; CLI11's own codes (100+) are outside this
    // tool's contract, so a bad command line is reported as 2 like a bad config.
    const int code = app.exit(e) == 0 ? 0 : 2;
    // `--resume CONFIG` (no config after it): --resume's optional value took the config.
    const auto ends_with = [&](const char* tail) {
      const std::string t(tail);
      return resume_from.size() > t.size() && resume_from.compare(resume_from.size() - t.size(), t.size(), t) == 0;
    };
    if (config_path.empty() && (ends_with(".yaml") || ends_with(".yml"))) {
      std::cerr << "atoll-train: --resume took '" << resume_from << "' as the checkpoint to resume; give the config "
                << "first (atoll-train " << resume_from << " --resume) or write --resume=DIR\n";
    }
    return code;
  }

  if (resume->count() > 0) options.resume = resume_from;
  if (options.resume_if_any) options.resume = "";
  atl::install_graceful_stop();
  atl::exit_on_escaped_exception("atoll-train");
  atl::report_file_size_limit_as_write_error();
  options.stop_requested = atl::graceful_stop_signal;
  // scripts/launch names a file to create once the run has prepared its outputs: its restarts
  // then resume the latest checkpoint instead of repeating this start's --resume DIR or --overwrite.
  if (const char* marker = std::getenv("ATOLL_LAUNCH_STARTED"); marker != nullptr && *marker != '\0') {
    options.started = [path = std::string(marker)] { std::ofstream(path) << "started\n"; };
  }
  std::string prefix;  // "[node N] " on the nodes other than 0, as their progress lines
  // Provisional, from --node-rank or a launcher's variables (scripts/launch, torchrun); not from
  // Slurm's alone, which a single-process run inside a Slurm step also sees.
  if (node.node_rank || std::getenv("NODE_RANK") || std::getenv("GROUP_RANK")) {
    try {
      const atl::NodeSpec given = atl::resolve_node_spec(node, atl::process_environment());
      prefix = atl::node_prefix(given.node_rank);
      atl::exit_on_escaped_exception(prefix + "atoll-train");
    } catch (const std::invalid_argument&) {  // reported with the launch, naming the variable
    }
  }
  // One write per message: the nodes of a job share a terminal, and their lines must not interleave.
  auto say = [&prefix](std::ostream& out, const std::string& message) {
    out << (prefix + "atoll-train: " + message + "\n") << std::flush;
  };
  try {
    atl::RunConfig config = atl::load_run_config(config_path, sets);
    atl::cpu::cpu_features();  // a bad ATOLL_CPU_ISA is refused here, not on a compute thread
    const bool node_flags = node.node_rank || node.nnodes || node.master_addr || node.master_port;
    if (node_flags && config.topology.backend != atl::Backend::ucx) {  // else each node would run the whole job
      throw atl::ConfigError(config.source_file, "topology.backend",
                             "--node-rank, --nnodes, --master-addr and --master-port need ucx");
    }
    if (config.topology.backend != atl::Backend::ucx) refuse_torchrun_nodes(config);
    if (config.topology.backend == atl::Backend::ucx && config.topology.engine == atl::Engine::actors) {
      train_as_node(config, node, options, sets, prefix);
      return 0;
    }
    const atl::EngineFactory engine = config.topology.engine == atl::Engine::reference ? atl::make_reference_engine
                                                                                      : atl::make_actor_engine;
    atl::run_training(config, options, engine, std::cout);
    return 0;
  } catch (const atl::JobMismatch& e) {  // another node runs a different job
    say(std::cerr, "config error: " + std::string(e.what()));
    return 2;
  } catch (const std::bad_alloc&) {
    say(std::cerr, "out of memory (the preflight estimate, docs/failures.md, is coarse: reduce train.micro_batch, "
                   "train.seq_len or the mesh)");
    return 1;
  } catch (const std::exception& e) {
    const int code = atl::exit_code_for(e);
    say(code == 0 ? std::cout : std::cerr, atl::end_message(e, sets));
    return code;
  }
}
