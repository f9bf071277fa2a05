// atoll-plan CONFIG.yaml [--set key.path=value ...] [--world-size N] [--graph [--graph-format
// text|json|dot]]: print the FSDP plan the runtime would execute for this config: units,
// policies, schedules, the mesh and its groups, and a per-rank memory estimate; with --graph,
// only the step program every rank runs (instructions and collective nodes). Nothing is written.
// Exit codes (atl::exit_code_for, docs/failures.md): 0 printed, 2 bad input (config, command line),
// 1 any other failure.
#include <limits>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/cli_checks.hpp"
#include "apps/end_message.hpp"
#include "graph/config.hpp"
#include "graph/data/data_source.hpp"
#include "graph/models/model.hpp"
#include "graph/plan/format.hpp"
#include "graph/plan/mesh.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"
#include "graph/training/run.hpp"
#include "graph/training/preflight.hpp"

int main(int argc, char** argv) {
  CLI::App app{"atoll-plan: show how a run config is split into FSDP units, and what each rank holds"};
  std::string config_path;
  std::vector<std::string> sets;
  std::optional<int> world_size;
  app.add_option("config", config_path, "YAML run config (see docs/config.md)")->required()->check(atl::non_empty_path());
  app.add_option("--set", sets, "override a config key: --set topology.mesh.dp_shard=4 (repeatable)");
  app.add_option("--world-size", world_size, "check the mesh against the ranks a launcher will start")
      ->check(CLI::Range(1, std::numeric_limits<int>::max(), "a positive rank count"));
  bool graph = false;
  std::string graph_format = "text";
  auto* graph_flag =
      app.add_flag("--graph", graph, "print the step program each rank runs (ops, gathers, collectives with sequence numbers)");
  app.add_option("--graph-format", graph_format, "text (default), json or dot (graphviz)")
      ->check(CLI::IsMember({"text", "json", "dot"}))
      ->needs(graph_flag);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a bad command line is reported as 2 like a bad config
  }

  try {
    const atl::RunConfig config = atl::load_run_config(config_path, sets);
    const std::shared_ptr<const atl::Model> model = atl::make_model(config.model, config.source_file);
    const atl::Mesh mesh(config.topology.mesh, config.source_file);
    if (world_size) mesh.check_world_size(*world_size);
    // What atoll-train refuses before it plans: micro-batches that do not split over the ranks,
    // data that does not fit the model.
    atl::micro_batches_per_rank(config, mesh);
    atl::check_data_fits_model(config.data, model->unpadded_vocab_size(), config.source_file);
    const atl::Plan plan = atl::make_plan(model->specs(), model->sharding_rules(), mesh, config.precision);
    if (graph) {
      const atl::StepProgram program =
          atl::compile_step_program(plan, model->ops(), atl::micro_batches_per_rank(config, mesh), config.train.schedule,
                                    config.topology.ep_dispatch);
      std::cout << (graph_format == "json"  ? atl::step_program_json(plan, program)
                    : graph_format == "dot" ? atl::step_program_dot(plan, program)
                                            : atl::format_step_program(plan, program));
      if (graph_format == "text") {
        const std::int64_t rows = config.train.micro_batch, seq = config.train.seq_len;
        std::cout << fmt::format("activations per micro-batch ({} rows x {} tokens):\n", rows, seq)
                  << atl::format_activations(model->ops(), model->activation_metas(rows, seq));
      }
      return 0;
    }
    // The memory peak of the step program the engine runs (pp = cp = 1), else the unit walk's.
    const std::optional<atl::StepProgram> program = atl::memory_program(config, *model, plan);
    std::cout << fmt::format("atoll-plan: {}: {} {} ({} parameters)\n", config.source_file, model->family(),
                             model->preset(), model->parameter_count())
              << atl::format_plan(plan, program ? &*program : nullptr);
    if (mesh.pp() > 1) {
      // What each cut sends per micro-batch (MODELS.md §5.6), from the family's parallelize rules.
      const std::int64_t rows = config.train.micro_batch;
      const std::int64_t seq =
          atl::cp_local_tokens(config.train.seq_len, mesh.cp(), model->sharding_rules().cp_chunks_per_rank);
      std::cout << fmt::format("\npipeline boundaries (per micro-batch: {} rows x {} tokens per rank{}):\n", rows, seq,
                               seq * mesh.cp() == config.train.seq_len
                                   ? ""
                                   : fmt::format(", seq_len {} padded to {} for cp", config.train.seq_len,
                                                 seq * mesh.cp()));
      for (int stage = 1; stage < mesh.pp(); ++stage) {
        std::int64_t cut = -1;
        for (const auto& u : plan.units) {
          if (u.stage == stage && u.layer >= 0 && (cut < 0 || u.layer < cut)) cut = u.layer;
        }
        for (const atl::TensorMeta& t : model->pipeline_boundary(cut, rows, seq, config.precision)) {
          std::int64_t elements = 1;
          for (std::int64_t d : t.shape) elements *= d;
          std::cout << fmt::format("  stage {} -> {} (before layer {}): {}  ({})\n", stage - 1, stage, cut,
                                   t.describe(), atl::format_bytes(elements * static_cast<std::int64_t>(
                                                                              atl::element_size(t.dtype))));
        }
      }
    }
    // What atoll-train's preflight checks: this process's whole estimate, activations included.
    const atl::RunMemoryEstimate run = atl::estimate_run_memory(config, *model);
    std::cout << "\nthis process (atoll-train's preflight estimate, activations included):\n";
    for (const auto& part : run.parts) {
      std::cout << fmt::format("  {:>10.1f} MiB  {}\n", part.bytes / (1 << 20), part.what);
    }
    const std::optional<double> room = atl::available_memory_bytes();
    std::cout << fmt::format("  {:>10.1f} MiB  total; available here: {}\n", run.total() / (1 << 20),
                             room ? fmt::format("{:.1f} MiB", *room / (1 << 20)) : std::string("unknown"));
    return 0;
  } catch (const std::exception& e) {
    return atl::report_failure("atoll-plan", e, sets);
  }
}
