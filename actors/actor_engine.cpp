#include "actors/actor_engine.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "actors/spawn.hpp"
#include "actors/supervision.hpp"

#include "comm/sim/sim_backend.hpp"
#include "graph/plan/flat_shards.hpp"
#include "graph/training/run.hpp"

namespace atl {

namespace {

SimOptions sim_options(const RunConfig& config) {
  static const std::map<std::string, CollectiveKind> kinds = {
      {"all_gather", CollectiveKind::all_gather}, {"reduce_scatter", CollectiveKind::reduce_scatter},
      {"all_reduce", CollectiveKind::all_reduce}, {"broadcast", CollectiveKind::broadcast},
      {"all_to_all_v", CollectiveKind::all_to_all_v}, {"send", CollectiveKind::send},
      {"recv", CollectiveKind::recv}};
  SimOptions options;
  for (const auto& [name, ms] : config.topology.sim_delay_ms) {
    options.delay[kinds.at(name)] = std::chrono::microseconds(static_cast<std::int64_t>(ms * 1000.0));
  }
  return options;
}

// The backend factory: the config's backend for the whole mesh (only sim is built).
std::shared_ptr<CommBackend> make_comm_backend(const RunConfig& config, int world, bool keep_records) {
  return std::make_shared<SimBackend>(world, sim_options(config),
                                      keep_records ? std::make_shared<CollectiveRecorder>()
                                                   : CollectiveRecorder::without_history());
}

// CAF's scheduler, sized for a process whose heavy work runs elsewhere: kernels run on detached
// compute actors and their pools, transfers on the backends' own threads (comm actors only post
// them). CAF's defaults (at least 4 workers; an idle worker spins, then polls 500 times with 50 us
// sleeps before it waits on its condition variable) held 18% of a 2-core machine's samples, 7.7%
// in context switches, while the compute threads worked (perf, beam-small). One worker per core,
// and 10 sleeping polls (0.5 ms) before the wait. A message sent from outside wakes a waiting
// worker at once; one a busy worker queues for itself waits for it (or for a steal, every 10 ms).
std::unique_ptr<caf::actor_system_config> scheduler_config() {
  auto config = std::make_unique<caf::actor_system_config>();
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  config->set("scheduler.max-threads", static_cast<std::size_t>(cores));
  config->set("work-stealing.moderate-poll-attempts", std::size_t{10});
  return config;
}

// `given`: the process was handed a backend (a multi-process launch brings its ucx backend).
void check_runnable(const RunConfig& config, const Mesh& mesh, bool given) {
  mesh.require_runnable();
  if (config.topology.backend == Backend::nccl) {
    throw ConfigError(config.source_file, "topology.backend", "nccl is not built yet; expected sim or ucx");
  }
  if (config.topology.backend == Backend::ucx && !given) {
    throw ConfigError(config.source_file, "topology.backend",
                      "ucx runs one atoll-train per node (--nnodes, or torchrun's or Slurm's variables, or "
                      "scripts/launch); this engine was given no ucx backend");
  }
  micro_batches_per_rank(config, mesh);  // throws unless every rank gets whole micro-batches
}

// An expert-group unit's export (every rank's shard, world rank order: the stage's export) as the
// model's tensors: EP slice e from the shards of ep_shard group e, the slices joined on dim 0.
TensorMap join_expert_group(const UnitPlan& unit, const Mesh& mesh, const Tensor& world_shards) {
  std::vector<TensorMap> slices;
  for (int e = 0; e < unit.ep_slices; ++e) {
    const Group group = mesh.ep_shard_group(mesh.ep_group(0).ranks.at(static_cast<std::size_t>(e)));
    Tensor gathered = Tensor::empty({group.size() * unit.shard_numel});
    for (int i = 0; i < group.size(); ++i) {
      const std::int64_t r = group.ranks[static_cast<std::size_t>(i)];
      gathered.slice_rows(i * unit.shard_numel, (i + 1) * unit.shard_numel)
          .copy_from(world_shards.slice_rows(r * unit.shard_numel, (r + 1) * unit.shard_numel));
    }
    slices.push_back(unpack_gathered(unit, gathered, group.size()));
  }
  return join_ep_slices(unit, slices);
}

}  // namespace

struct ActorEngine::Impl {
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const Model> model;
  std::vector<int> ranks;  // this process's ranks, increasing
  std::shared_ptr<const StepProgram> program;
  std::int64_t rows_per_step = 0;  // this process's rows of a global batch: its blocks' micro-batches
  // A failed step or export leaves the ranks' collective streams with numbers nobody will post
  // (every later collective would wait forever): the engine refuses further work instead.
  std::string broken;

  void check_usable() const {
    if (!broken.empty()) throw std::runtime_error("actor runtime: unusable after an earlier failure: " + broken);
  }

  std::shared_ptr<CollectiveRecorder> recorder;
  std::shared_ptr<CollectiveTap> traffic;  // this process's ranks' records, taken every step
  std::shared_ptr<SpanTracer> tracer;
  std::shared_ptr<CommBackend> backend;  // outlives the actor system (declared first, destroyed last)
  std::unique_ptr<caf::actor_system_config> system_config;
  std::unique_ptr<caf::actor_system> system;
  std::vector<std::vector<unit_actor>> units;  // [rank][unit]
  std::vector<stage_actor> stages;
  std::vector<compute_actor> computes;
  std::vector<comm_actor> comms;
  trainer_actor trainer;
  std::int64_t steps = 0;
  int stop_signal = 0;  // request_stop's: the next steps carry it to every process

  ~Impl() { stop_all(); }

  // A failure while the engine is being built (std::bad_alloc, no thread for a detached actor):
  // stop what was spawned, then abandon the actor system rather than destroy it. A spawn that
  // failed halfway may have registered an actor that never runs, and the system's destructor
  // would wait for it forever; leaking on this error path is what keeps the process able to exit.
  void abandon_after_failure() {
    if (!system) return;
    stop_handles();
    // The system keeps using its config and the backend (comm actors) until it is gone: leak
    // them with it.
    [[maybe_unused]] caf::actor_system* leaked = system.release();
    [[maybe_unused]] caf::actor_system_config* leaked_config = system_config.release();
    [[maybe_unused]] auto* leaked_backend = new std::shared_ptr<CommBackend>(std::move(backend));
  }

  void stop_all() {
    // Stop every actor explicitly so the system's destructor does not wait on anything.
    if (!system) return;
    stop_handles();
    system.reset();
  }

  void stop_handles() {
    auto stop = [](const auto& handle) { caf::anon_send_exit(handle, caf::exit_reason::user_shutdown); };
    stop(trainer);
    for (const auto& s : stages) stop(s);
    for (const auto& c : computes) stop(c);
    for (const auto& rank_units : units)
      for (const auto& u : rank_units) stop(u);
    for (const auto& c : comms) stop(c);
    // Drop our handles too: a detached actor's thread waits until its last reference is gone.
    trainer = nullptr;
    stages.clear();
    computes.clear();
    units.clear();
    comms.clear();
  }

  // A blocking line to the trainer: asks it and waits for the answer. The trainer answers with an
  // error when any actor of the process stops; the line monitors the trainer, so its own end (an
  // exception in it) ends the wait too. A failure leaves the engine unusable (the ranks' collective
  // streams hold numbers nobody will post).
  class TrainerLine {
   public:
    explicit TrainerLine(Impl& im) : im_(im), self_(*im.system) {
      im_.check_usable();
      self_->monitor(im_.trainer);
    }
    ~TrainerLine() { self_->demonitor(im_.trainer.address()); }
    TrainerLine(const TrainerLine&) = delete;
    TrainerLine& operator=(const TrainerLine&) = delete;

    template <class Result, class... Message>
    Result ask(Message... message) {
      std::optional<Result> out;
      std::string error;
      self_->send(im_.trainer, message...);
      self_->receive([&](Result r) { out = std::move(r); },
                     [&](caf::error& e) { error = error_text(*im_.system, e); },
                     [&](caf::down_msg& d) { error = "the trainer stopped: " + error_text(*im_.system, d.reason); });
      if (!error.empty()) {
        im_.broken = error;
        throw std::runtime_error("actor runtime: " + error);
      }
      return std::move(*out);
    }

   private:
    Impl& im_;
    caf::scoped_actor self_;
  };
};

ActorEngine::ActorEngine(EngineInputs in, ProcessOptions process) : impl_(std::make_unique<Impl>()) {
  const RunConfig& config = in.config;
  Mesh mesh(config.topology.mesh, config.source_file);
  check_runnable(config, mesh, process.backend != nullptr);
  auto& im = *impl_;
  im.model = in.model;
  im.plan = std::make_shared<const Plan>(make_plan(in.model->specs(), in.model->sharding_rules(), mesh, config.precision));
  const Plan& plan = *im.plan;
  // Compiled once (it throws before anything is spawned if a unit has no reader); every rank runs it.
  im.program = std::make_shared<const StepProgram>(
      compile_step_program(plan, in.model->ops(), micro_batches_per_rank(config, mesh), config.train.schedule,
                           config.topology.ep_dispatch));
  const int world = mesh.world_size();

  im.ranks = process.ranks;
  if (im.ranks.empty()) {
    for (int r = 0; r < world; ++r) im.ranks.push_back(r);
  }
  std::sort(im.ranks.begin(), im.ranks.end());
  for (std::size_t i = 0; i < im.ranks.size(); ++i) {
    if (im.ranks[i] < 0 || im.ranks[i] >= world || (i > 0 && im.ranks[i] == im.ranks[i - 1])) {
      throw std::invalid_argument("actor runtime: this process's ranks must be distinct ranks of the " +
                                  std::to_string(world) + "-rank mesh; got rank " + std::to_string(im.ranks[i]));
    }
  }
  im.rows_per_step = static_cast<std::int64_t>(im.program->micro_batches) * config.train.micro_batch *
                     static_cast<std::int64_t>(mesh.dp_indices(im.ranks).size());
  // compute.threads, or the default for this process's ranks (results do not depend on it).
  const int threads_per_rank = compute_threads(config, static_cast<int>(im.ranks.size()));
  im.backend = process.backend ? process.backend : make_comm_backend(config, world, in.keep_collective_records);
  if (im.backend->world_size() != world) {
    throw std::invalid_argument("actor runtime: the " + im.backend->name() + " backend serves " +
                                std::to_string(im.backend->world_size()) + " ranks, the mesh has " +
                                std::to_string(world));
  }
  im.recorder = im.backend->recorder();
  im.traffic = im.recorder->tap(im.ranks);
  im.tracer = std::make_shared<SpanTracer>(im.recorder->epoch(), in.trace);
  im.system_config = scheduler_config();
  im.system = std::make_unique<caf::actor_system>(*im.system_config);
  im.steps = in.start_step;

  try {
    spawn_actors(in, plan, mesh, threads_per_rank);
  } catch (const std::exception& e) {
    // (Read before abandon_after_failure hands the backend over to the leak.)
    const std::string hint = im.backend->name() == "sim"
                                 ? " (sim runs every rank's actors and threads in this process: use fewer ranks, or "
                                   "more memory and threads)"
                                 : "";
    im.abandon_after_failure();
    const std::string ranks = static_cast<int>(im.ranks.size()) == world
                                  ? std::to_string(world)
                                  : std::to_string(im.ranks.size()) + " of " + std::to_string(world);
    throw std::runtime_error("building the actor runtime for " + ranks + " ranks failed: " + e.what() + hint);
  }
}

void ActorEngine::spawn_actors(const EngineInputs& in, const Plan& plan, const Mesh& mesh, int threads_per_rank) {
  auto& im = *impl_;
  auto& sys = *im.system;
  const RunConfig& config = in.config;
  std::map<std::string, bool> weight_decay;
  for (const auto& s : in.model->specs()) weight_decay[s.name] = s.weight_decay;
  im.units.resize(im.ranks.size());
  for (std::size_t local = 0; local < im.ranks.size(); ++local) {
    const int rank = im.ranks[local];
    const Group shard_group = mesh.shard_group(rank), replicate_group = mesh.replicate_group(rank);
    // Every handle is kept the moment it exists, so a failure later can stop it.
    std::vector<std::unique_ptr<Communicator>> communicators;
    communicators.push_back(im.backend->communicator(shard_group, rank));
    communicators.push_back(im.backend->communicator(replicate_group, rank));
    communicators.push_back(im.backend->communicator(mesh.world_group(), rank));
    if (mesh.ep() > 1) {  // the experts ops' exchanges and the expert groups' shards
      communicators.push_back(im.backend->communicator(mesh.ep_group(rank), rank));
      communicators.push_back(im.backend->communicator(mesh.ep_shard_group(rank), rank));
    }
    comm_actor comm = spawn_comm_actor(sys, std::move(communicators));
    im.comms.push_back(comm);
    for (std::size_t u = 0; u < plan.units.size(); ++u) {
      const UnitPlan& unit = plan.units[u];
      UnitActorSetup setup;
      setup.plan = im.plan;
      setup.unit_index = u;
      setup.rank = rank;
      const bool experts = unit.role == UnitRole::experts;
      setup.shard_index = experts ? mesh.ep_shard_group(rank).index_of(rank) : shard_group.index_of(rank);
      const int ep_index = unit.ep_slices > 1 ? mesh.ep_group(rank).index_of(rank) : 0;  // its EP slice
      setup.comm = comm;
      // A fresh model is generated shard by shard (no process builds the whole model); given
      // weights and moments (resume, warm start) are cut from the full tensors.
      setup.initial_shard =
          in.initial_master.names().empty()
              ? init_shard(unit, in.model->specs(), config.train.seed, in.model->init_std(), setup.shard_index,
                           ep_index)
              : pack_shard(unit, in.initial_master, setup.shard_index, unit.shard_count, ep_index);
      auto moment = [&](const TensorMap& given) {
        return given.names().empty() ? Tensor::zeros({unit.shard_numel})
                                     : pack_shard(unit, given, setup.shard_index, unit.shard_count, ep_index);
      };
      setup.initial_exp_avg = moment(in.initial_exp_avg);
      setup.initial_exp_avg_sq = moment(in.initial_exp_avg_sq);
      for (const auto& p : unit.params) setup.weight_decay.push_back(weight_decay.at(p.name));
      setup.tracer = im.tracer;
      im.units[local].push_back(spawn_unit_actor(sys, std::move(setup)));
    }
    compute_actor compute = spawn_compute_actor(sys, rank, threads_per_rank, im.tracer);
    im.computes.push_back(compute);
    im.stages.push_back(spawn_stage_actor(
        sys, StageActorSetup{im.plan, im.model, rank, im.units[local], compute, comm, im.program, im.tracer}));
  }
  std::vector<WatchedActor> watched;
  for (std::size_t local = 0; local < im.ranks.size(); ++local) {
    const std::string rank = "rank " + std::to_string(im.ranks[local]);
    watched.push_back({caf::actor_cast<caf::actor>(im.stages[local]), rank + " stage"});
    watched.push_back({caf::actor_cast<caf::actor>(im.computes[local]), rank + " compute"});
    watched.push_back({caf::actor_cast<caf::actor>(im.comms[local]), rank + " comm"});
    for (std::size_t u = 0; u < plan.units.size(); ++u) {
      watched.push_back({caf::actor_cast<caf::actor>(im.units[local][u]), rank + " unit " + plan.units[u].name});
    }
  }
  im.trainer = spawn_trainer_actor(sys, TrainerActorSetup{im.plan, im.ranks, im.stages, config.train.micro_batch,
                                                          in.start_step, in.optimizer, im.tracer,
                                                          std::move(watched), in.model->routed_experts()});
}

ActorEngine::~ActorEngine() = default;

std::vector<RowRange> ActorEngine::rows_read(std::int64_t global_rows) const {
  const Mesh& mesh = impl_->plan->mesh;
  if (global_rows % mesh.dp_size() != 0) {
    throw std::invalid_argument("actor runtime: a global batch of " + std::to_string(global_rows) +
                                " rows does not split into " + std::to_string(mesh.dp_size()) + " data-parallel ranks");
  }
  const std::int64_t block = global_rows / mesh.dp_size();
  std::vector<RowRange> out;
  for (int dp : mesh.dp_indices(impl_->ranks)) {
    const RowRange mine{dp * block, (dp + 1) * block};
    if (!out.empty() && out.back().end == mine.begin) {
      out.back().end = mine.end;  // contiguous blocks read as one range
    } else {
      out.push_back(mine);
    }
  }
  return out;
}

StepResult ActorEngine::step(const Batch& rows, bool record_routing) {
  auto& im = *impl_;
  im.check_usable();
  // Refused before any rank numbers a collective: the engine stays usable, as the reference does.
  if (rows.rows() != im.rows_per_step) {
    throw std::invalid_argument("actor runtime: a step takes this process's " + std::to_string(im.rows_per_step) +
                                " rows of the global batch (rows_read), got " + std::to_string(rows.rows()));
  }
  im.traffic->take();  // (what came between steps: a checkpoint's export)
  im.recorder->set_step(++im.steps);
  StepResult result =
      Impl::TrainerLine(im).ask<StepResult>(step_atom::value, ProcessStep{rows, record_routing, im.stop_signal});
  for (const CollectiveRecord& rec : im.traffic->take()) {
    // Traffic of this process's ranks (the tap's), but the world report's bookkeeping: the experts
    // ops' exchanges, and parameters.
    if (rec.axis == "world") continue;
    if (rec.axis == kExpertAxis) {
      if (rec.tag.ends_with(":dispatch")) result.bytes_dispatch += rec.bytes;
      if (rec.tag.ends_with(":combine")) result.bytes_combine += rec.bytes;
      continue;
    }
    if (rec.kind == CollectiveKind::all_gather) result.bytes_gathered += rec.bytes;
    if (rec.kind == CollectiveKind::reduce_scatter || rec.kind == CollectiveKind::all_reduce) {
      result.bytes_reduced += rec.bytes;
    }
  }
  return result;
}

void ActorEngine::request_stop(int signal) { impl_->stop_signal = signal; }

TrainingState ActorEngine::state() const {
  auto& im = *impl_;
  const Plan& plan = *im.plan;
  // Every rank all-gathers every unit's shards over its shard group (collectives: the ranks of
  // other processes take part from there); this process keeps its first rank's copy.
  Impl::TrainerLine line(im);
  im.recorder->set_step(-1);  // between steps: the record tags these collectives with step -1
  const GatheredState kept = line.ask<GatheredState>(export_atom::value);
  TensorMap full[3];
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    const UnitPlan& unit = plan.units[u];
    const Tensor parts[3] = {kept.units[u].master, kept.units[u].exp_avg, kept.units[u].exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      TensorMap params = unit.ep_slices > 1 ? join_expert_group(unit, plan.mesh, parts[k])
                                            : unpack_gathered(unit, parts[k], unit.shard_count);
      for (const auto& name : params.names()) full[k].insert(name, params.at(name));
    }
  }
  TrainingState out;
  out.step = im.steps;
  for (const auto& s : im.model->specs()) {  // canonical (spec) order
    out.master.insert(s.name, full[0].at(s.name));
    out.exp_avg.insert(s.name, full[1].at(s.name));
    out.exp_avg_sq.insert(s.name, full[2].at(s.name));
  }
  return out;
}

double ActorEngine::gather_round_trip_us(std::size_t unit, int iterations) {
  auto& im = *impl_;
  Impl::TrainerLine line(im);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) line.ask<done_atom>(probe_atom::value, static_cast<std::uint64_t>(unit));
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iterations;
}

std::optional<std::string> ActorEngine::chrome_trace() const {
  if (!impl_->tracer->recording()) return std::nullopt;  // EngineInputs::trace was off
  return impl_->tracer->chrome_trace_json();
}
const Plan& ActorEngine::plan() const { return *impl_->plan; }
const StepProgram& ActorEngine::program() const { return *impl_->program; }
std::vector<CollectiveRecord> ActorEngine::collective_records() const { return impl_->recorder->records(); }
std::vector<Span> ActorEngine::spans() const { return impl_->tracer->spans(); }

std::unique_ptr<TrainingEngine> make_actor_engine(EngineInputs inputs) {
  return std::make_unique<ActorEngine>(std::move(inputs));
}

}  // namespace atl
