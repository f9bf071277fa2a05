// The step program (graph/plan/step_program.hpp) is what the runtime executes: the collectives a
// run records are exactly the program's collective nodes, in the program's order, on every rank
// (DESIGN.md "The plan is the dataflow graph"); and the program's schedule is FSDP2's.
#include <catch2/catch.hpp>

#include <map>
#include <tuple>

#include "actors/actor_engine.hpp"
#include "actors/trace.hpp"
#include "graph/plan/step_program.hpp"
#include "tests/actors/actor_test_support.hpp"

using namespace atl;
using namespace atl::testing;

namespace {

CollectiveKind kind_of(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather: return CollectiveKind::all_gather;
    case CollectiveOp::reduce_scatter: return CollectiveKind::reduce_scatter;
    case CollectiveOp::all_reduce: return CollectiveKind::all_reduce;
    case CollectiveOp::all_to_all_v: return CollectiveKind::all_to_all_v;
  }
  return CollectiveKind::broadcast;
}

}  // namespace

TEST_CASE("Every rank records exactly the step program's collectives in its order, for several meshes and families",
          "[actors][program]") {
  struct Case {
    const char* family;
    const char* preset;
    Layout layout;
    std::int64_t global_batch, micro_batch;
    StepSchedule schedule = StepSchedule::one_at_a_time;
  };
  const Case cases[] = {
      {"beam", "beam-tiny-moe", {2, 1}, 2, 1},   // one micro-batch per rank
      {"beam", "beam-tiny-moe", {2, 2}, 8, 1},   // HSDP, two micro-batches per rank
      {"beam", "beam-tiny-moe", {2, 2}, 8, 1, StepSchedule::all_forward_first},
      {"beam", "beam-tiny-dense", {4, 1}, 4, 1},
      {"flint", "flint-tiny", {1, 2}, 6, 1},     // replicate only, three micro-batches
      {"inkling2", "inkling2-tiny", {2, 1}, 4, 1},
  };
  for (const Case& c : cases) {
    INFO(c.family << " dp_shard " << c.layout.dp_shard << " dp_replicate " << c.layout.dp_replicate << " batch "
                  << c.global_batch << " " << step_schedule_name(c.schedule));
    RunConfig config = parity_config(c.family, c.preset, Precision::bf16, c.layout, c.global_batch, c.micro_batch);
    config.train.schedule = c.schedule;
    std::unique_ptr<TrainingEngine> engine;
    run_engine(config, make_actor_engine, 2, false, &engine);
    auto& actors = dynamic_cast<ActorEngine&>(*engine);
    const Plan& plan = actors.plan();
    const auto model = make_model(config.model, config.source_file);
    const int per_rank = static_cast<int>(c.global_batch / c.micro_batch / (c.layout.dp_shard * c.layout.dp_replicate));
    // The records are checked against the program the engine ran; it is the one compiled here
    // from the plan, instruction for instruction.
    const StepProgram& program = actors.program();
    const StepProgram compiled = compile_step_program(plan, model->ops(), per_rank, c.schedule);
    CHECK(format_step_program(plan, program) == format_step_program(plan, compiled));
    CHECK(program.micro_batches == per_rank);
    CHECK(program.schedule == c.schedule);
    REQUIRE(!program.collectives.empty());

    // Per (step, rank, axis): the records in completion order (a group completes in issue order).
    std::map<std::tuple<std::int64_t, int, std::string>, std::vector<CollectiveRecord>> recorded;
    for (const CollectiveRecord& r : actors.collective_records()) {
      if (r.step >= 1) recorded[{r.step, r.rank, r.axis}].push_back(r);  // step -1: the state export
    }
    std::size_t total = 0;
    for (const auto& [key, list] : recorded) total += list.size();
    CHECK(total == 2 * static_cast<std::size_t>(plan.mesh.world_size()) * program.collectives.size());

    for (std::int64_t step : {1, 2}) {
      for (int rank = 0; rank < plan.mesh.world_size(); ++rank) {
        std::map<std::string, std::size_t> next;  // per axis: records matched so far
        double last_posted = -1;
        for (const CollectiveNode& node : program.collectives) {
          INFO("step " << step << " rank " << rank << " collective #" << node.seq << " "
                       << collective_op_name(node.op) << " of " << node.tag);
          const auto& list = recorded[{step, rank, node.axis}];
          const std::size_t at = next[node.axis]++;
          REQUIRE(at < list.size());
          const CollectiveRecord& r = list[at];
          CHECK(r.kind == kind_of(node.op));
          CHECK(r.tag == node.tag);
          const Group group = node.axis == "dp_shard"       ? plan.mesh.shard_group(rank)
                              : node.axis == "dp_replicate" ? plan.mesh.replicate_group(rank)
                                                            : plan.mesh.world_group();
          CHECK(r.group == group.describe());
          // Across groups too, the rank posts in the program's order (one stream per rank).
          CHECK(r.start_us >= last_posted);
          last_posted = r.start_us;
        }
        for (const auto& [axis, matched] : next) CHECK(recorded[{step, rank, axis}].size() == matched);
      }
    }
  }
}

TEST_CASE("Step program: FSDP2's schedule for n micro-batches, sequence numbers dense and in instruction order",
          "[plan][program]") {
  const RunConfig config = parity_config("beam", "beam-tiny-moe", Precision::bf16, {2, 2}, 8, 1);
  const auto model = make_model(config.model, config.source_file);
  const Plan plan = make_plan(model->specs(), model->sharding_rules(), Mesh(config.topology.mesh), Precision::bf16);
  const auto& op_units = model->ops();
  for (int n : {1, 2, 3}) {
    INFO(n << " micro-batches");
    const StepProgram p = compile_step_program(plan, op_units, n);
    std::map<std::string, int> gathers, reduce_scatters, all_reduces;
    for (std::size_t i = 0; i < p.collectives.size(); ++i) {
      const CollectiveNode& node = p.collectives[i];
      CHECK(node.seq == i);
      const std::string& unit = node.tag;
      if (node.op == CollectiveOp::all_gather) ++gathers[unit];
      if (node.op == CollectiveOp::reduce_scatter) ++reduce_scatters[unit];
      if (node.op == CollectiveOp::all_reduce) ++all_reduces[unit];
    }
    // Instructions name collectives in increasing order; forward/backward alternate per micro-batch.
    std::uint64_t previous = 0;
    bool first = true;
    int forwards = 0, backwards = 0;
    for (const StepInstruction& i : p.instructions) {
      if (i.kind == StepInstructionKind::forward) ++forwards;
      if (i.kind == StepInstructionKind::backward) ++backwards;
      if (i.kind == StepInstructionKind::gather || (i.kind == StepInstructionKind::grads && i.last)) {
        CHECK((first || i.collective > previous));
        previous = i.collective;
        first = false;
      }
    }
    CHECK(forwards == n * static_cast<int>(op_units.size()));
    CHECK(backwards == forwards);
    for (const UnitPlan& u : plan.units) {
      INFO(u.name);
      // A resharding unit gathers for the first forward and for every backward (it stays gathered
      // between micro-batches); islands and kept units once per step.
      CHECK(gathers[u.name] == (u.schedule.reshard_after_forward ? 1 + n : 1));
      CHECK(reduce_scatters[u.name] == 1);
      CHECK(all_reduces[u.name] == 1);  // HSDP
    }
    // The last collective is the step's report over the world.
    CHECK(p.collectives.back().axis == "world");
    CHECK(p.collectives.back().tag == "report");
    CHECK(p.instructions.back().kind == StepInstructionKind::report);
  }
  CHECK_THROWS_AS(compile_step_program(plan, op_units, 0), std::invalid_argument);
  const std::string text = format_step_program(plan, compile_step_program(plan, op_units, 1));
  CHECK(text.find("gather    model.layers.0.mlp.gate") != std::string::npos);
  CHECK(text.find("all_reduce over dp_replicate") != std::string::npos);
}

TEST_CASE("All forwards first (GPipe order) keeps every micro-batch in flight and changes no number",
          "[actors][program]") {
  for (const char* family : {"beam", "flint"}) {
    INFO(family);
    const RunConfig config = parity_config(family, std::string(family) == "beam" ? "beam-tiny-moe" : "flint-tiny",
                                           Precision::bf16, {2, 1}, 8, 1);  // 4 micro-batches per rank
    std::unique_ptr<TrainingEngine> plain_engine;
    const RunOutput plain = run_engine(config, make_actor_engine, 2, true, &plain_engine);
    const auto model = make_model(config.model, config.source_file);
    const Plan& plan = dynamic_cast<ActorEngine&>(*plain_engine).plan();
    const StepProgram one = compile_step_program(plan, model->ops(), 4);
    const StepProgram all = compile_step_program(plan, model->ops(), 4, StepSchedule::all_forward_first);
    CHECK(one.activation_buffers == 1);
    CHECK(all.activation_buffers == 4);

    RunConfig gpipe_config = config;
    gpipe_config.train.schedule = StepSchedule::all_forward_first;
    std::unique_ptr<TrainingEngine> gpipe_engine;
    const RunOutput gpipe = run_engine(gpipe_config, make_actor_engine, 2, true, &gpipe_engine);
    // Each engine ran the program of its schedule (else the comparison below were of one order).
    CHECK(dynamic_cast<ActorEngine&>(*plain_engine).program().activation_buffers == 1);
    CHECK(dynamic_cast<ActorEngine&>(*gpipe_engine).program().activation_buffers == 4);
    check_same_steps(gpipe, plain, 0.0, true);
    CHECK(same_routing(gpipe.steps[0].routing, plain.steps[0].routing));
    CHECK(bitwise_equal(gpipe.master, plain.master));
  }
}

TEST_CASE("A compute run is a maximal chain of forwards and backwards that a forward of op 0 only starts",
          "[actors][program]") {
  const RunConfig config = parity_config("beam", "beam-tiny-moe", Precision::bf16, {1, 1}, 2, 1);
  const auto model = make_model(config.model, config.source_file);
  const Plan plan = make_plan(model->specs(), model->sharding_rules(), Mesh(config.topology.mesh, "test.yaml"),
                              config.precision);
  auto is_compute = [](const StepInstruction& i) {
    return i.kind == StepInstructionKind::forward || i.kind == StepInstructionKind::backward;
  };
  for (const StepSchedule schedule : {StepSchedule::one_at_a_time, StepSchedule::all_forward_first}) {
    for (int micro_batches : {1, 2}) {
      INFO(step_schedule_name(schedule) << ", " << micro_batches << " micro-batches");
      const StepProgram p = compile_step_program(plan, model->ops(), micro_batches, schedule);
      const auto& ins = p.instructions;
      std::size_t runs = 0, computes = 0;
      for (std::size_t i = 0; i < ins.size();) {
        if (!is_compute(ins[i])) {
          CHECK_THROWS_AS(compute_run_end(p, i), std::invalid_argument);
          ++i;
          continue;
        }
        const std::size_t end = compute_run_end(p, i);
        REQUIRE(end > i);
        for (std::size_t k = i; k < end; ++k) {
          CHECK(is_compute(ins[k]));
          CHECK_FALSE((k > i && ins[k].kind == StepInstructionKind::forward && ins[k].op == 0));
        }
        // Maximal: what follows is not a compute, or is a forward of op 0.
        CHECK((end == ins.size() || !is_compute(ins[end]) ||
               (ins[end].kind == StepInstructionKind::forward && ins[end].op == 0)));
        computes += end - i;
        ++runs;
        i = end;
      }
      CHECK(computes == 2 * p.ops.size() * static_cast<std::size_t>(micro_batches));
      if (micro_batches == 1) {
        // Counted by hand from `atoll-plan --graph` (beam-tiny-moe, 4 MoE layers of 5 ops, 23 ops):
        // forward: embed, then each layer's 5 ops (a release and a gather split the layers);
        // forward head and loss, backward loss and head; per layer backward combine..router, then
        // (after the router's grads) attention; backward embed. 5 + 1 + 4 * 2 + 1 = 15 jobs for 46 ops.
        CHECK(computes == 46);
        CHECK(runs == 15);
      }
    }
  }
}

TEST_CASE("A step's compute spans are the program's forwards and backwards, one per op, in program order",
          "[actors][program]") {
  // Compute runs go to the compute actor as one job; each op still has its own span (and error text).
  const RunConfig config = parity_config("beam", "beam-tiny-moe", Precision::bf16, {2, 1}, 4, 1);
  std::unique_ptr<TrainingEngine> engine, untraced;
  run_engine(
      config,
      [](EngineInputs in) {
        in.trace = true;
        return make_actor_engine(std::move(in));
      },
      2, false, &engine);
  auto& actors = dynamic_cast<ActorEngine&>(*engine);
  const StepProgram& program = actors.program();  // the one the engine ran
  REQUIRE(program.micro_batches == 2);
  // Without EngineInputs::trace nothing is kept (a long run would hold every span).
  run_engine(config, make_actor_engine, 1, false, &untraced);
  CHECK(dynamic_cast<ActorEngine&>(*untraced).spans().empty());
  CHECK_FALSE(untraced->chrome_trace().has_value());
  std::vector<std::string> expected;
  for (const StepInstruction& i : program.instructions) {
    if (i.kind == StepInstructionKind::forward || i.kind == StepInstructionKind::backward) {
      expected.push_back(std::string(step_instruction_name(i.kind)) + " " + program.ops[static_cast<std::size_t>(i.op)].name);
    }
  }
  REQUIRE(expected.size() == 2 * 2 * program.ops.size());
  for (int rank = 0; rank < 2; ++rank) {
    for (std::int64_t step : {1, 2}) {
      INFO("rank " << rank << " step " << step);
      std::vector<std::string> names;
      double last_end = 0;
      for (const Span& s : actors.spans()) {
        if (s.rank != rank || s.step != step || s.category != "compute") continue;
        CHECK(s.start_us >= last_end);  // one compute actor per rank: spans never overlap
        last_end = s.end_us;
        names.push_back(s.name);
      }
      CHECK(names == expected);
    }
  }
}

TEST_CASE("The step program refuses pp or cp above 1, naming the key: it has none of their collectives",
          "[plan][program]") {
  const RunConfig config = parity_config("beam", "beam-tiny-moe", Precision::bf16, {1, 1}, 8, 1);
  const auto model = make_model(config.model, config.source_file);
  for (const char* axis : {"pp", "cp"}) {
    INFO(axis);
    MeshConfig mesh = config.topology.mesh;
    (std::string(axis) == "pp" ? mesh.pp : mesh.cp) = 2;
    const Plan plan = make_plan(model->specs(), model->sharding_rules(), Mesh(mesh), Precision::bf16);
    try {
      compile_step_program(plan, model->ops(), 2);
      FAIL("compiled a step program for " << axis << " = 2");
    } catch (const ConfigError& e) {
      CHECK(e.key() == std::string("topology.mesh.") + axis);
      CHECK(std::string(e.what()).find("expected 1, got 2") != std::string::npos);
    }
  }
}
