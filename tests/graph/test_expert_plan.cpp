// Expert parallelism in the planner (issue 10, MODELS.md §5.1, §5.3 step 1, §5.5): expert-group
// units, their dim-1 shards of one EP slice, which rows an exchange moves, and the step program's
// exchanges.
#include <catch2/catch.hpp>

#include <cstring>

#include "graph/models/beam/model.hpp"
#include "graph/plan/expert_exchange.hpp"
#include "graph/plan/flat_shards.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"

using namespace atl;

namespace {

Plan ep_plan(const Model& model, int dp_shard, int ep, int dp_replicate = 1) {
  MeshConfig c;
  c.dp_shard = dp_shard;
  c.dp_replicate = dp_replicate;
  c.ep = ep;
  return make_plan(model.specs(), model.sharding_rules(), Mesh(c, "test.yaml"), Precision::bf16);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// Experts [first, first + n) of a full [E, ...] tensor.
Tensor experts_of(const Tensor& full, std::int64_t first, std::int64_t n) { return full.slice_rows(first, first + n).clone(); }

}  // namespace

TEST_CASE("expert plan: each MoE layer's experts form one expert-group unit over ep_shard, sharded on dim 1",
          "[plan][experts]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  const Plan plan = ep_plan(model, 4, 2);  // ep_shard 2
  std::int64_t elements = 0;
  for (const auto& u : plan.units) elements += u.numel * u.ep_slices;
  CHECK(elements == model.parameter_count());  // every parameter once, experts once per owner
  for (std::int64_t l = 0; l < 4; ++l) {
    const std::string layer = "model.layers." + std::to_string(l);
    const UnitPlan& experts = plan.unit(layer + ".mlp.experts");
    INFO(experts.name);
    CHECK(experts.role == UnitRole::experts);
    CHECK(experts.shard_axis == "ep_shard");
    CHECK(experts.shard_count == 2);
    CHECK(experts.ep_slices == 2);
    CHECK_FALSE(experts.island);
    CHECK(experts.policy == bulk_policy(Precision::bf16));
    // 8 experts, H 64, I 32: each EP rank holds 4; dim 1 (H for gate_up, I for down) is sharded.
    const UnitParam& gate_up = experts.param(layer + ".mlp.experts.gate_and_up_projs");
    CHECK(gate_up.shape == Shape{4, 64, 64});
    CHECK(gate_up.shard_dim == 1);
    CHECK(gate_up.outer == 4);
    CHECK(gate_up.rows_per_rank == 32);
    CHECK(gate_up.shard_numel == 4 * 32 * 64);
    const UnitParam& down = experts.param(layer + ".mlp.experts.down_projs");
    CHECK(down.shape == Shape{4, 32, 64});
    CHECK(down.rows_per_rank == 16);
    CHECK(&plan.unit_of_param(layer + ".mlp.experts.down_projs") == &experts);
    // The block keeps the rest of the layer; the router stays its own island.
    CHECK(plan.unit(layer).params.size() == 12);
    CHECK(plan.unit_of_param(layer + ".mlp.gate.weight").island);
    // Forward order: the layer's islands, its block, then its experts.
    CHECK(plan.unit_index(layer + ".mlp.experts") == plan.unit_index(layer) + 1);
  }
  // ep_shard 1 (dp_shard = ep): nothing to shard, each rank holds its experts whole.
  const Plan whole = ep_plan(model, 2, 2);
  CHECK(whole.unit("model.layers.0.mlp.experts").shard_count == 1);
  CHECK(whole.unit("model.layers.0.mlp.experts").shard_numel == 4 * 64 * 64 + 4 * 32 * 64);
}

TEST_CASE("expert plan: dim-1 shards of every EP slice gather back to the slice, a fresh model's shards match",
          "[plan][experts][shard]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  const TensorMap full = TensorMap::initialized(model.specs(), 5, model.init_std());
  for (const auto& [dp, ep] : {std::pair{4, 2}, std::pair{8, 2}, std::pair{6, 2}, std::pair{4, 4}}) {
    const Plan plan = ep_plan(model, dp, ep);
    const UnitPlan& unit = plan.unit("model.layers.1.mlp.experts");
    INFO("dp_shard " << dp << " ep " << ep << " ep_shard " << unit.shard_count);
    std::vector<TensorMap> slices;
    for (int e = 0; e < ep; ++e) {
      Tensor gathered = Tensor::empty({unit.shard_count * unit.shard_numel});
      for (int i = 0; i < unit.shard_count; ++i) {
        const Tensor shard = pack_shard(unit, full, i, unit.shard_count, e);
        CHECK(same_bits(shard, init_shard(unit, model.specs(), 5, model.init_std(), i, e)));
        gathered.slice_rows(i * unit.shard_numel, (i + 1) * unit.shard_numel).copy_from(shard);
      }
      const TensorMap slice = unpack_gathered(unit, gathered, unit.shard_count);
      for (const auto& p : unit.params) {
        const std::int64_t n = p.shape[0];
        CHECK(same_bits(slice.at(p.name), experts_of(full.at(p.name), e * n, n)));
      }
      slices.push_back(slice);
    }
    const TensorMap joined = join_ep_slices(unit, slices);
    for (const auto& p : unit.params) CHECK(same_bits(joined.at(p.name), full.at(p.name)));
  }
  const Plan plan = ep_plan(model, 4, 2);
  const UnitPlan& unit = plan.unit("model.layers.0.mlp.experts");
  CHECK_THROWS_WITH(pack_shard(unit, full, 0, 2, 2), Catch::Contains("EP slice 2 is outside [0, 2)"));
}

TEST_CASE("expert exchange: rows per owner and per source from every source's rows per expert",
          "[plan][experts]") {
  // ep 2, E 4: source 0 routes [1, 2, 3, 4] rows to experts 0..3, source 1 [5, 0, 0, 6].
  const Tensor counts = Tensor::empty({8}, DType::i64);
  const std::int64_t values[] = {1, 2, 3, 4, 5, 0, 0, 6};
  std::memcpy(counts.raw(), values, sizeof(values));
  const ExpertExchange owner0 = plan_expert_exchange(counts, 2, 0);  // experts 0, 1
  CHECK(owner0.send_rows == std::vector<std::int64_t>{3, 7});
  CHECK(owner0.recv_rows == std::vector<std::int64_t>{3, 5});
  CHECK(owner0.source_offsets == std::vector<std::vector<std::int64_t>>{{0, 1, 3}, {0, 5, 5}});
  const ExpertExchange owner1 = plan_expert_exchange(counts, 2, 1);  // experts 2, 3
  CHECK(owner1.send_rows == std::vector<std::int64_t>{5, 6});
  CHECK(owner1.recv_rows == std::vector<std::int64_t>{7, 6});
  CHECK(owner1.source_offsets == std::vector<std::vector<std::int64_t>>{{0, 3, 7}, {0, 0, 6}});
  CHECK(owner0.sent() + owner1.sent() == owner0.received() + owner1.received());
  CHECK(element_counts({3, 5}, 64) == std::vector<std::int64_t>{192, 320});
  CHECK_THROWS_AS(plan_expert_exchange(counts, 3, 0), std::invalid_argument);  // 3 does not divide 8 / 3
  CHECK_THROWS_AS(plan_expert_exchange(counts, 2, 2), std::invalid_argument);
}

TEST_CASE("expert step program: the experts ops exchange over ep, expert groups gather and reduce over ep_shard only",
          "[plan][experts][program]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  const Plan plan = ep_plan(model, 2, 2, 2);  // HSDP: dp_replicate 2 x dp_shard 2, ep 2 -> ep_shard 2
  const StepProgram program = compile_step_program(plan, model.ops(), 2);
  int forward = 0, backward = 0, experts_ops = 0;
  for (const OpSpec& op : program.ops) experts_ops += op.kind == OpKind::experts;
  REQUIRE(experts_ops == 4);
  for (const StepInstruction& i : program.instructions) {
    const bool is_experts_op = i.op >= 0 && program.ops[static_cast<std::size_t>(i.op)].kind == OpKind::experts;
    if (i.is_compute()) CHECK_FALSE(is_experts_op);  // never run as a local op
    if (i.kind == StepInstructionKind::expert_forward || i.kind == StepInstructionKind::expert_backward) {
      CHECK(is_experts_op);
      const bool fwd = i.kind == StepInstructionKind::expert_forward;
      (fwd ? forward : backward) += 1;
      // The all_to_all flow's exchanges, written out (not read back from expert_exchange_parts).
      using enum CollectiveOp;
      const std::vector<std::pair<CollectiveOp, std::string>> expected =
          fwd ? std::vector<std::pair<CollectiveOp, std::string>>{{all_gather, "counts"},
                                                                  {all_to_all_v, "dispatch"},
                                                                  {all_to_all_v, "dispatch_weights"},
                                                                  {all_to_all_v, "combine"}}
              : std::vector<std::pair<CollectiveOp, std::string>>{{all_to_all_v, "combine_grad"},
                                                                  {all_to_all_v, "dispatch_grad"},
                                                                  {all_to_all_v, "dispatch_weights_grad"}};
      REQUIRE(i.collective_count == static_cast<int>(expected.size()));
      for (int k = 0; k < i.collective_count; ++k) {
        const CollectiveNode& node = program.collectives[i.collective + static_cast<std::uint64_t>(k)];
        CHECK(node.axis == "ep");
        CHECK(node.op == expected[static_cast<std::size_t>(k)].first);
        CHECK(node.tag == program.ops[static_cast<std::size_t>(i.op)].name + ":" + expected[static_cast<std::size_t>(k)].second);
      }
    }
    if (i.kind == StepInstructionKind::gather || (i.kind == StepInstructionKind::grads && i.last)) {
      const UnitPlan& u = plan.units[i.unit];
      for (std::uint64_t c : posted_by(i)) {
        INFO(u.name << " " << program.collectives[c].axis);
        if (u.role == UnitRole::experts) {
          CHECK(program.collectives[c].axis == "ep_shard");  // no replicate all-reduce either
        } else {
          CHECK(program.collectives[c].axis != "ep_shard");
        }
      }
      if (i.kind == StepInstructionKind::grads) CHECK(i.collective_count == (u.role == UnitRole::experts ? 1 : 2));
    }
  }
  CHECK(forward == 4 * 2);   // per MoE layer per micro-batch
  CHECK(backward == 4 * 2);

  // The all_gather flow (the reference algorithm): its exchanges, written out.
  const StepProgram gathered =
      compile_step_program(plan, model.ops(), 2, StepSchedule::one_at_a_time, ExpertDispatchFlow::all_gather);
  auto tags_of = [&](StepInstructionKind kind) {
    std::vector<std::string> tags;
    for (const StepInstruction& i : gathered.instructions) {
      if (i.kind != kind) continue;
      for (int k = 0; k < i.collective_count; ++k) {
        const CollectiveNode& node = gathered.collectives[i.collective + static_cast<std::uint64_t>(k)];
        tags.push_back(std::string(collective_op_name(node.op)) + " " +
                       node.tag.substr(node.tag.find(':') + 1));
      }
      break;  // the first such instruction
    }
    return tags;
  };
  CHECK(tags_of(StepInstructionKind::expert_forward) ==
        std::vector<std::string>{"all_gather dispatch", "all_gather dispatch_weights", "all_gather dispatch_indices",
                                 "all_gather dispatch_mask", "all_reduce combine"});
  CHECK(tags_of(StepInstructionKind::expert_backward) ==
        std::vector<std::string>{"all_gather combine_grad", "reduce_scatter dispatch_grad",
                                 "reduce_scatter dispatch_weights_grad"});
}
