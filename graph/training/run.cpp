#include "graph/training/run.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "graph/data/data_source.hpp"
#include "graph/models/beam/model_config.hpp"
#include "graph/reference/trainer.hpp"
#include "graph/plan/mesh.hpp"
#include "graph/training/output_path.hpp"
#include "graph/training/preflight.hpp"
#include "graph/training/run_records.hpp"
#include "graph/training/run_start.hpp"
#include "graph/training/starting_point.hpp"
#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/model_weights.hpp"
#include "kernels/cpu/compute_pool.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "graph/checkpoint/durable_file.hpp"

namespace atl {

namespace {


// The reference engine runs one rank.
void check_reference_supports(const RunConfig& c) {
  const auto& m = c.topology.mesh;
  const std::pair<const char*, std::int64_t> axes[] = {{"pp", m.pp},
                                                       {"dp_replicate", m.dp_replicate},
                                                       {"dp_shard", m.dp_shard},
                                                       {"cp", m.cp},
                                                       {"ep", m.ep}};
  for (const auto& [name, size] : axes) {
    if (size != 1) {
      throw ConfigError(c.source_file, std::string("topology.mesh.") + name,
                        "topology.engine reference runs a 1-rank mesh; got " + std::to_string(size) +
                            " (the actor runtime, topology.engine: actors, runs larger meshes)");
    }
  }
  if (c.topology.backend != Backend::sim) {
    throw ConfigError(c.source_file, "topology.backend",
                      std::string("topology.engine reference runs on the sim backend only; got ") +
                          backend_name(c.topology.backend) + " (the actor runtime, topology.engine: actors, runs it)");
  }
}

}  // namespace

OptimizerSettings optimizer_settings(const TrainConfig& t) {
  OptimizerSettings o;
  o.lr = t.lr;
  o.warmup = t.warmup;
  o.total_steps = t.steps;
  o.min_lr_ratio = t.min_lr_ratio;
  o.weight_decay = t.weight_decay;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.adam_eps;
  o.grad_clip = t.grad_clip;
  return o;
}

TensorMap initial_moments(const TensorMap& given, const std::vector<ParamSpec>& specs) {
  return given.names().empty() ? TensorMap::zeros_like(specs) : given;
}

void use_bf16_gemm(const RunConfig& config) {
  if (config.compute.bf16_amx && !cpu::amx_available()) {
    throw ConfigError(config.source_file, "compute.bf16_gemm",
                      "amx needs a CPU with AMX tiles and bf16 (Sapphire Rapids or later) and a Linux that grants "
                      "their state; this one has " + cpu::kernel_description(cpu::cpu_features()) +
                          " (use chain, the default)");
  }
  cpu::use_bf16_amx(config.compute.bf16_amx);
}

int compute_threads(const RunConfig& config, int ranks_here) {
  if (config.compute.threads > 0) return static_cast<int>(config.compute.threads);
  return cpu::default_compute_threads(ranks_in_process(config, ranks_here));
}

int ranks_in_process(const RunConfig& config, int ranks_here) {
  if (ranks_here > 0) return ranks_here;
  return config.topology.engine == Engine::reference ? 1 : static_cast<int>(config.topology.mesh.world_size());
}

int micro_batches_per_rank(const RunConfig& config, const Mesh& mesh) {
  const auto& t = config.train;
  const std::int64_t micro_batches = t.global_batch / t.micro_batch;
  if (micro_batches % mesh.dp_size() != 0) {
    throw ConfigError(config.source_file, "train.global_batch",
                      "expected a multiple of train.micro_batch x dp_replicate x dp_shard = " +
                          std::to_string(t.micro_batch * mesh.dp_size()) + " so every data-parallel rank gets whole "
                          "micro-batches, got " + std::to_string(t.global_batch));
  }
  return static_cast<int>(micro_batches / mesh.dp_size());
}

std::unique_ptr<TrainingEngine> make_reference_engine(EngineInputs in) {
  check_reference_supports(in.config);
  const auto& specs = in.model->specs();
  TensorMap master = in.initial_master.names().empty()
                         ? TensorMap::initialized(specs, in.config.train.seed, in.model->init_std())
                         : std::move(in.initial_master);
  TrainingState start{in.start_step, std::move(master), initial_moments(in.initial_exp_avg, specs),
                      initial_moments(in.initial_exp_avg_sq, specs)};
  return std::make_unique<ReferenceTrainer>(in.model, std::move(start), in.config.precision,
                                            in.config.train.micro_batch, in.optimizer,
                                            compute_threads(in.config));
}

std::string stop_signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : std::to_string(signal);
}

namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02d}s", s / 60, s % 60) : fmt::format("{}s", s);
}

nlohmann::json trainer_state_json(const RunConfig& config, const Model& model, const TrainingEngine& engine,
                                  std::int64_t step, std::int64_t tokens, const DataSource& data) {
  return {{"step", step},
          {"tokens", tokens},
          {"data_cursor", data.cursor()},
          {"seed", config.train.seed},
          {"family", model.family()},
          {"preset", model.preset()},
          {"engine", engine.name()},
          {"config", to_json(config)}};
}

// The run header: what trains, on what, from where, and the settings worth a second look.
void print_run_header(std::ostream& out, const RunConfig& config, const Model& model, const TrainingEngine& engine,
                      const DataSource& data, const std::string& cpu_kernel, int threads,
                      const StartingPoint& begin) {
  const auto& t = config.train;
  const auto& mesh = config.topology.mesh;
  const std::string experts =
      mesh.ep > 1 ? fmt::format(", ep {} ({})", mesh.ep, expert_dispatch_flow_name(config.topology.ep_dispatch)) : "";
  out << fmt::format("atoll-train: {} {} ({} parameters), {} steps of {}x{} tokens, precision {}, engine {} "
                     "(dp_shard {} x dp_replicate {}{}), data {}, cpu kernels {} with {} thread(s) per rank\n",
                     model.family(), model.preset(), model.parameter_count(), t.steps, t.global_batch, t.seq_len,
                     precision_name(config.precision), engine.name(), mesh.dp_shard, mesh.dp_replicate, experts,
                     data.describe(), cpu_kernel, threads)
      << std::flush;
  out << "start: " << begin.description << "\n";
  // The portable chain on FMAs at the avx512 level (where compute.bf16_gemm: amx can run: its
  // packers are AVX-512, so a capped ATOLL_CPU_ISA rules it out), on a CPU with AMX.
  const cpu::CpuFeatures& kernels = cpu::cpu_features();
  if (config.precision == Precision::bf16 && !config.compute.bf16_amx && kernels.isa == cpu::Isa::avx512 &&
      !kernels.bf16_dot && cpu::amx_in_cpu()) {
    out << "note: bf16 GEMMs run the portable chain on fp32 FMAs here (about fp32's speed); compute.bf16_gemm: amx "
           "runs them on this CPU's AMX tiles, much faster, the same bits then only among CPUs with AMX "
           "(docs/numerics.md has the measured speeds)\n";
  }
  if (!begin.changed_settings.empty()) {
    out << "note: settings differ from the checkpoint's run: " << begin.changed_settings
        << " (the steps from here differ from that run's own continuation)\n";
  }
  if (!begin.model_changes.empty()) {
    out << "note: the model differs from that of the checkpoint it starts from (its config.json): "
        << begin.model_changes << "\n";
  }
  if (t.warmup > 0 && t.warmup >= t.steps) {  // legal (a short probe of a long schedule), but rarely meant
    const std::string reach = t.warmup == t.steps ? std::string("reaches train.lr only at the last step")
                                                  : fmt::format("rises to {:.3g} of train.lr by the last step",
                                                                static_cast<double>(t.steps) / static_cast<double>(t.warmup));
    out << fmt::format("note: train.warmup ({}) is not below train.steps ({}): the learning rate {} and never decays\n",
                       t.warmup, t.steps, reach);
  }
}

// The run's checkpoints: every process takes part in gathering the state, node 0 (the writer)
// saves it; the last one saved is remembered.
class RunCheckpoints {
 public:
  RunCheckpoints(const RunConfig& config, const Model& model, TrainingEngine& engine, const DataSource& data,
                 bool writer, std::int64_t first_step, std::ostream& out)
      : config_(config), model_(model), engine_(engine), data_(data), writer_(writer), first_step_(first_step),
        out_(out) {}

  // `tokens`: trained on up to and including `step`; `last_applied`: the last step whose update
  // was applied (first_step - 1 when none was), to name the one to blame for unsavable weights.
  std::filesystem::path save(std::int64_t step, std::int64_t tokens, std::int64_t last_applied) {
    TrainingState state = engine_.state();  // a collective: every process takes part
    if (!writer_) {
      return remember(step, std::filesystem::path(config_.checkpoint.dir) / (checkpoint_dir_name(step) + " (on node 0)"));
    }
    CheckpointContents contents{step,
                                std::move(state.master),
                                std::move(state.exp_avg),
                                std::move(state.exp_avg_sq),
                                trainer_state_json(config_, model_, engine_, step, tokens, data_),
                                model_.hf_config()};
    std::filesystem::path saved;
    try {
      saved = save_checkpoint(config_.checkpoint.dir, contents, static_cast<int>(config_.checkpoint.keep));
    } catch (const UnsavableState& e) {
      throw DivergedWeights(diverged_message(step, last_applied, e.what()));
    } catch (const std::exception& e) {
      // A file (FileWriteError), its folder or the rename into place (filesystem_error): the step
      // named. Anything else is not the file system's and goes on as it is.
      if (!dynamic_cast<const FileWriteError*>(&e) && !dynamic_cast<const std::filesystem::filesystem_error*>(&e)) throw;
      throw FileWriteError(fmt::format("the checkpoint of step {} was not saved: {}; {}", step, e.what(), what_is_kept()));
    }
    out_ << "checkpoint saved: " << saved.string() << "\n" << std::flush;
    return remember(step, saved);
  }

  // The step saved last (-1: none), and where.
  std::int64_t last_saved() const { return last_saved_; }
  const std::filesystem::path& last_saved_path() const { return last_saved_path_; }

 private:
  const std::filesystem::path& remember(std::int64_t step, std::filesystem::path path) {
    last_saved_ = step;
    last_saved_path_ = std::move(path);
    return last_saved_path_;
  }

  std::string what_is_kept() const {
    const std::optional<std::filesystem::path> kept = latest_checkpoint(config_.checkpoint.dir);
    return kept ? "the latest checkpoint, " + kept->string() + ", is kept" : std::string("checkpoint.dir holds no checkpoint");
  }

  // A skipped step changed nothing: an earlier applied update is the one to blame.
  std::string diverged_message(std::int64_t step, std::int64_t last_applied, const char* what) const {
    const std::string which =
        last_applied == step ? fmt::format("step {}: the update left", step)
        : last_applied < first_step_
            ? fmt::format("step {} (skipped, as every step since the start): the weights it started from hold", step)
            : fmt::format("step {} (skipped): the update of step {}, the last one applied, left", step, last_applied);
    return fmt::format("{} values a checkpoint may not hold{} (usually a learning rate far too large: lower "
                       "train.lr): {}; {}",
                       which, last_applied == step ? " although the step's loss and gradient norm were finite" : "",
                       what, what_is_kept());
  }

  const RunConfig& config_;
  const Model& model_;
  TrainingEngine& engine_;
  const DataSource& data_;
  const bool writer_;
  const std::int64_t first_step_;
  std::ostream& out_;
  std::int64_t last_saved_ = -1;
  std::filesystem::path last_saved_path_;
};

// The console's word on a step not applied; throws NonFiniteError when the run may not go on.
void report_not_applied(std::ostream& out, const StepResult& r, std::int64_t step, std::int64_t skipped,
                        const TrainConfig& t) {
  if (held_no_targets(r)) {
    out << fmt::format("step {:>5}/{}  not applied: its rows hold no target (only padding or one-token "
                       "documents)\n", step, t.steps)
        << std::flush;
    return;
  }
  if (!t.skip_nonfinite_steps) {
    throw NonFiniteError(fmt::format("step {}: {}; the step was not applied and no checkpoint was saved "
                                     "(train.on_nonfinite: stop)",
                                     step, r.nonfinite));
  }
  if (skipped > t.max_skipped_steps) {
    throw NonFiniteError(fmt::format("step {}: {}; {} steps skipped, more than train.max_skipped_steps ({})", step,
                                     r.nonfinite, skipped, t.max_skipped_steps));
  }
  out << fmt::format("step {:>5}/{}  skipped: {} ({} skipped so far)\n", step, t.steps, r.nonfinite, skipped)
      << std::flush;
}

}  // namespace

double run_training(const RunConfig& config, const RunOptions& options, const EngineFactory& make_engine,
                    std::ostream& out) {
  // Everything that can be wrong with the config is found before run_dir is touched.
  use_bf16_gemm(config);
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  Mesh(config.topology.mesh, config.source_file).require_runnable();  // planned, not run yet: pp, cp, ep > 1
  check_memory_preflight(config, *model, options.ranks_here);  // before the data source, the weights or the engine allocate
  auto data = make_data_source(config.data, model->unpadded_vocab_size(), config.train.seed, config.source_file);
  const auto& t = config.train;
  // (A single process is the writer: the checks of its outputs come first, writing nothing.)
  StartingPoint begin = options.from_writer ? shared_starting_point(config, options, *model)
                                            : writer_starting_point(config, options, *model);
  if (begin.data_cursor) {
    try {
      data->restore(*begin.data_cursor);
    } catch (const DataError& e) {  // name the checkpoint, not only the data source
      throw DataError("data.source does not fit the checkpoint's data position (" + begin.description +
                      ", trainer_state.json \"data_cursor\"): " + e.what());
    }
  }
  const std::int64_t tokens_before = begin.tokens;
  const std::int64_t first_step = begin.state.step + 1;
  std::unique_ptr<TrainingEngine> engine =
      make_engine(EngineInputs{config, model, std::move(begin.state.master), optimizer_settings(t),
                               std::move(begin.state.exp_avg), std::move(begin.state.exp_avg_sq), first_step - 1,
                               !options.trace_path.empty()});

  // The first batch is read before anything is written, so a bad data file leaves run_dir alone.
  // A process reads only its ranks' rows of each global batch and skips the others'.
  const std::vector<RowRange> ranges = engine->rows_read(t.global_batch);
  if (data->used_up()) {
    throw RunFinished(fmt::format("nothing to do: {} has no data left after step {} (data.loop: false)",
                                  data->describe(), first_step - 1));
  }
  std::optional<Batch> first_batch = read_rows(*data, t.global_batch, t.seq_len, ranges);
  namespace fs = std::filesystem;
  const fs::path run_dir = config.run_dir;
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  const std::string cpu_kernel = cpu::kernel_description(cpu::cpu_features());
  const int threads = compute_threads(config, options.ranks_here);
  nlohmann::json run_json = run_record(config, *model, *engine, *data, cpu_kernel, threads, begin.began_from);
  std::ofstream metrics;
  if (options.writer) {
    create_directories_durably(run_dir);
    // metrics.jsonl starts as the history this run continues (empty for a fresh run), written
    // durably in one piece. Read before run.json is rewritten: a damaged record stops the run with
    // nothing changed.
    const MetricsHistory history = begin.resumed ? read_metrics_history(metrics_path, first_step) : MetricsHistory{};
    write_file_durably(run_dir / "run.json", run_json.dump(2) + "\n");
    prepare_checkpoint_dir(config, options, begin, history.cut, out);
    write_file_durably(metrics_path, history.kept);
    metrics.open(metrics_path, std::ios::app);
    if (!metrics) throw std::runtime_error("cannot append to " + metrics_path.string());
    if (options.started) options.started();
  }
  print_run_header(out, config, *model, *engine, *data, cpu_kernel, threads, begin);

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  double last_loss = 0;
  std::int64_t tokens_total = tokens_before;
  std::int64_t skipped = 0;
  std::int64_t last_applied = first_step - 1;  // the last step whose update was applied (skip_step), or the start
  RunCheckpoints checkpoints(config, *model, *engine, *data, options.writer, first_step, out);
  auto write_trace = [&] {
    if (options.trace_path.empty()) return;  // (each node its own ranks', at its own path: node_trace_path)
    auto trace = engine->chrome_trace();
    if (!trace) throw std::runtime_error(std::string("engine ") + engine->name() + " records no trace");
    create_parent_folders(options.trace_path);
    write_file_durably(options.trace_path, *trace);
    out << "trace written to " << options.trace_path << "\n";
  };
  int stop_signal = 0;  // the signal this process was asked to stop by
  auto requested = [&] { return options.stop_requested ? options.stop_requested() : 0; };  // (a signal, or 0)
  // A stop request (SIGTERM, SIGINT) ends the run between steps, saving the last finished one.
  auto stop_after = [&](std::int64_t done, int signal) {
    std::string saved = "no checkpoint (checkpoint.every is 0)";
    if (done < first_step) {
      saved = "no step was taken";
    } else if (config.checkpoint.every > 0) {
      const fs::path path = checkpoints.last_saved() == done ? checkpoints.last_saved_path()
                                                             : checkpoints.save(done, tokens_total, last_applied);
      saved = "checkpoint " + path.string() + " holds it; continue with --resume";
    }
    metrics.close();
    try {
      write_trace();
    } catch (const std::exception& e) {  // the stop still ends as a stop (and keeps its exit code)
      saved += std::string("; the trace was not written: ") + e.what();
    }
    // (A process the signal did not reach stops with the job, by the job's signal and exit code. One
    // whose own copy landed mid-step, after another's request began the stop, was reached.)
    const int own = stop_signal != 0 ? stop_signal : requested();
    const bool reached = own == signal;
    throw RunStopped(signal, fmt::format("stopped by {}{} after step {} of {}: {}", stop_signal_name(signal),
                                         reached ? "" : " (sent to another process of the job)", done, t.steps,
                                         saved));
  };
  std::int64_t last_step = first_step - 1;
  for (std::int64_t s = first_step; s <= t.steps; ++s) {
    if (!first_batch && data->used_up()) {  // data.loop: false, and no row can hold a target
      out << fmt::format("the data ran out after step {} ({}): the run ends {} steps short of train.steps\n", s - 1,
                         data->describe(), t.steps - (s - 1))
          << std::flush;
      // The run has ended, as at train.steps: a stop asked for now (it would travel in a next step
      // no process takes) ends it as finished on every process, not as a stop on this one alone.
      if (const int signal = requested(); signal != 0) {
        out << "(" << stop_signal_name(signal) << " came as the run ended: nothing to stop)\n";
      }
      if (config.checkpoint.every > 0 && checkpoints.last_saved() != s - 1) {
        checkpoints.save(s - 1, tokens_total, last_applied);
      }
      break;
    }
    if (const int signal = requested(); signal != 0 && stop_signal == 0) {
      // An engine whose processes agree on the stop carries the request through the next step
      // (every process stops after the same step); otherwise stop here.
      stop_signal = signal;  // (first: stop_after names a stop this process was not sent as another's)
      if (!engine->agrees_on_stop()) stop_after(s - 1, signal);
      engine->request_stop(signal);
    }
    last_step = s;
    const auto step_start = clock::now();
    Batch batch = first_batch ? std::move(*first_batch) : read_rows(*data, t.global_batch, t.seq_len, ranges);
    first_batch.reset();
    data->check_unchanged();  // a file edited in place: refused before its rows train (the last checkpoint stands)
    StepResult r = engine->step(batch);
    const double step_seconds = std::chrono::duration<double>(clock::now() - step_start).count();
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    tokens_total += r.tokens;
    if (r.applied) {
      last_loss = r.loss;  // the final loss is the trained model's, not a skipped step's
      last_applied = s;
    } else if (!held_no_targets(r)) {
      ++skipped;
    }
    if (options.writer) append_metrics_line(metrics, metrics_path, step_record(r, tokens_total, step_seconds, elapsed, skipped), s);
    if (!r.applied) report_not_applied(out, r, s, skipped, t);
    if (s == first_step || s % t.log_every == 0 || s == t.steps) {
      const double eta = elapsed / static_cast<double>(s - first_step + 1) * static_cast<double>(t.steps - s);
      out << fmt::format("step {:>5}/{}  loss {:.4f}  grad_norm {:.3f}  lr {:.2e}  tokens/s {:.0f}  eta {}\n", s,
                         t.steps, r.loss, r.grad_norm, r.lr, static_cast<double>(tokens_total - tokens_before) / elapsed,
                         format_duration(eta))
          << std::flush;
    }
    if (config.checkpoint.every > 0 && (s % config.checkpoint.every == 0 || s == t.steps)) {
      checkpoints.save(s, tokens_total, last_applied);
    }
    // Some process asked to stop: every process learns it from this step and stops after it.
    if (r.stop_signal != 0 && s < t.steps) stop_after(s, r.stop_signal);
  }
  metrics.close();
  if (options.writer) {  // a restart with --resume-if-any of a run that saved nothing then has nothing to do
    run_json["finished"] = true;
    write_file_durably(run_dir / "run.json", run_json.dump(2) + "\n");
  }
  write_trace();
  out << fmt::format("final loss={:.6f} steps={}\n", last_loss, last_step) << std::flush;
  return last_loss;
}

}  // namespace atl
