// The planner (MODELS.md §5.1-5.3, §6 items 3, 4, 17): mesh layout and groups, unit formation,
// policies and schedules, flat-shard layout and round trips, memory estimate, printed plan.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "graph/models/beam/model.hpp"
#include "graph/plan/flat_shards.hpp"
#include "graph/plan/format.hpp"
#include "graph/plan/memory.hpp"
#include "graph/plan/mesh.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"

using namespace atl;

namespace {

MeshConfig mesh_config(std::int64_t dp_shard, std::int64_t dp_replicate = 1) {
  MeshConfig c;
  c.dp_shard = dp_shard;
  c.dp_replicate = dp_replicate;
  return c;
}

Plan beam_plan(const std::string& preset, std::int64_t dp_shard = 1, Precision precision = Precision::bf16,
               std::int64_t dp_replicate = 1) {
  const BeamModel model(beam_preset(preset));
  return make_plan(model.specs(), beam_sharding_rules(), Mesh(mesh_config(dp_shard, dp_replicate), "test.yaml"),
                   precision);
}

std::vector<std::string> unit_names(const Plan& plan) {
  std::vector<std::string> names;
  for (const auto& u : plan.units) names.push_back(u.name);
  return names;
}

ParamSpec spec(std::string name, Shape shape, bool island = false) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.island = island;
  return s;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// The concatenation of every member's shard: what an all-gather delivers.
Tensor gather_all(const UnitPlan& unit, const TensorMap& full) {
  Tensor out = Tensor::empty({unit.shard_count * unit.shard_numel});
  for (int i = 0; i < unit.shard_count; ++i) {
    Tensor shard = pack_shard(unit, full, i, unit.shard_count);
    std::memcpy(out.data<float>() + i * unit.shard_numel, shard.data<float>(), shard.bytes());
  }
  return out;
}

std::string line_of(const std::string& text, const std::string& start) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return {};
}

// A table row split at runs of two or more spaces (cells hold single spaces only).
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::size_t i = 0;
  while (i < line.size()) {
    std::size_t end = line.find("  ", i);
    if (end == std::string::npos) end = line.size();
    cells.push_back(line.substr(i, end - i));
    i = line.find_first_not_of(' ', end);
    if (i == std::string::npos) break;
  }
  return cells;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Mesh

TEST_CASE("plan mesh: coordinates, dp index and groups for dp_shard x dp_replicate layouts", "[plan][mesh]") {
  const std::pair<int, int> layouts[] = {{1, 1}, {2, 1}, {4, 1}, {3, 1}, {2, 2}};
  for (const auto& [dp_shard, dp_replicate] : layouts) {
    INFO("dp_shard " << dp_shard << " dp_replicate " << dp_replicate);
    const Mesh mesh(mesh_config(dp_shard, dp_replicate), "test.yaml");
    REQUIRE(mesh.world_size() == dp_shard * dp_replicate);
    REQUIRE(mesh.dp_size() == dp_shard * dp_replicate);
    REQUIRE(mesh.shard_group_size() == dp_shard);
    std::set<int> dp_indices;
    for (int r = 0; r < mesh.world_size(); ++r) {
      const RankCoord c = mesh.coord(r);
      CHECK(c.pp == 0);
      CHECK(c.cp == 0);
      CHECK(c.dp_replicate == r / dp_shard);  // dp_replicate outer, dp_shard inner
      CHECK(c.dp_shard == r % dp_shard);
      CHECK(mesh.rank_of(c) == r);
      CHECK(mesh.dp_index(r) == c.dp_replicate * dp_shard + c.dp_shard);
      dp_indices.insert(mesh.dp_index(r));

      const Group shard = mesh.shard_group(r);
      CHECK(shard.axis == "dp_shard");
      REQUIRE(shard.size() == dp_shard);
      CHECK(shard.ranks[c.dp_shard] == r);
      for (int i = 0; i < shard.size(); ++i) CHECK(shard.ranks[i] == c.dp_replicate * dp_shard + i);

      const Group replicate = mesh.replicate_group(r);
      CHECK(replicate.axis == "dp_replicate");
      REQUIRE(replicate.size() == dp_replicate);
      CHECK(replicate.ranks[c.dp_replicate] == r);
      for (int i = 0; i < replicate.size(); ++i) CHECK(replicate.ranks[i] == i * dp_shard + c.dp_shard);
    }
    CHECK(static_cast<int>(dp_indices.size()) == mesh.dp_size());  // every rank owns a distinct block

    // Distinct groups: dp_replicate shard groups, then dp_shard replicate groups; each axis partitions the world.
    const auto groups = mesh.all_groups();
    REQUIRE(static_cast<int>(groups.size()) == dp_replicate + dp_shard);
    std::map<std::string, std::multiset<int>> covered;
    for (const auto& g : groups) covered[g.axis].insert(g.ranks.begin(), g.ranks.end());
    for (const auto& axis : {"dp_shard", "dp_replicate"}) {
      std::multiset<int> all;
      for (int r = 0; r < mesh.world_size(); ++r) all.insert(r);
      CHECK(covered[axis] == all);
    }
    CHECK(groups.front().axis == "dp_shard");
    CHECK(groups.back().axis == "dp_replicate");
  }

  const Mesh hsdp(mesh_config(2, 2), "test.yaml");
  const auto groups = hsdp.all_groups();
  REQUIRE(groups.size() == 4);
  CHECK(groups[0] == Group{"dp_shard", {0, 1}});
  CHECK(groups[1] == Group{"dp_shard", {2, 3}});
  CHECK(groups[2] == Group{"dp_replicate", {0, 2}});
  CHECK(groups[3] == Group{"dp_replicate", {1, 3}});
  CHECK_THROWS_AS(hsdp.coord(4), std::out_of_range);
  CHECK_THROWS_AS(hsdp.rank_of({0, 2, 0, 0}), std::out_of_range);
}

TEST_CASE("plan mesh: bad sizes are ConfigErrors naming the key and the file, pp, cp > 1 plan but do not run",
          "[plan][mesh]") {
  auto error_of = [](MeshConfig c) -> std::pair<std::string, std::string> {
    try {
      Mesh mesh(c, "configs/x.yaml");
      mesh.require_runnable();
    } catch (const ConfigError& e) {
      return {e.key(), e.what()};
    }
    return {"", "no error"};
  };
  for (const char* axis : {"pp", "cp"}) {
    MeshConfig c = mesh_config(2);
    if (std::string(axis) == "pp") c.pp = 2;
    if (std::string(axis) == "cp") c.cp = 2;
    CHECK_NOTHROW(Mesh(c, "configs/x.yaml"));  // the planner lays it out
    const auto [key, message] = error_of(c);   // the runtime refuses it
    INFO(message);
    CHECK(key == std::string("topology.mesh.") + axis);
    CHECK(message.find("configs/x.yaml") != std::string::npos);
    CHECK(message.find("not implemented yet (issue: pipeline/context parallelism)") != std::string::npos);
  }
  MeshConfig ep2 = mesh_config(2);
  ep2.ep = 2;
  CHECK(error_of(ep2).first.empty());  // expert parallelism runs
  MeshConfig huge;  // each axis allowed, the product far beyond int64 if multiplied at once
  huge.pp = huge.dp_replicate = huge.dp_shard = huge.cp = 1 << 24;
  CHECK(error_of(huge).first == "topology.mesh");
  MeshConfig ep3 = mesh_config(4);
  ep3.ep = 3;  // must divide dp_replicate x dp_shard x cp = 4
  CHECK(error_of(ep3).first == "topology.mesh.ep");
  CHECK(error_of(ep3).second.find("expected a divisor of dp_replicate x dp_shard x cp = 4") != std::string::npos);
  MeshConfig zero = mesh_config(0);
  CHECK(error_of(zero).first == "topology.mesh.dp_shard");
  MeshConfig negative = mesh_config(1, -2);
  CHECK(error_of(negative).first == "topology.mesh.dp_replicate");
  CHECK(error_of(negative).second.find("-2") != std::string::npos);

  const Mesh mesh(mesh_config(2, 2), "configs/x.yaml");
  CHECK_NOTHROW(mesh.check_world_size(4));
  try {
    mesh.check_world_size(3);
    FAIL("check_world_size(3) accepted a 4-rank mesh");
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(e.key() == "topology.mesh");
    CHECK(message.find("configs/x.yaml") != std::string::npos);
    CHECK(message.find("= 4 ranks") != std::string::npos);
    CHECK(message.find("started 3") != std::string::npos);
  }
}

TEST_CASE("plan mesh: cp, pp, ep and ep_shard groups partition the world as MODELS.md 5.1 lays them out",
          "[plan][mesh]") {
  MeshConfig c;
  c.pp = 2;
  c.dp_replicate = 2;
  c.dp_shard = 2;
  c.cp = 2;
  c.ep = 4;  // 8 ranks per stage -> ep_shard 2
  const Mesh mesh(c, "test.yaml");
  REQUIRE(mesh.world_size() == 16);
  REQUIRE(mesh.stage_size() == 8);
  REQUIRE(mesh.ep_shard() == 2);
  for (int r = 0; r < mesh.world_size(); ++r) {
    INFO("rank " << r);
    const RankCoord rc = mesh.coord(r);
    const Group cp = mesh.cp_group(r);
    REQUIRE(cp.size() == 2);
    CHECK(cp.ranks[rc.cp] == r);
    CHECK(cp.ranks[1] - cp.ranks[0] == 1);  // cp is the fastest axis
    const Group pp = mesh.pp_group(r);
    REQUIRE(pp.size() == 2);
    CHECK(pp.ranks[rc.pp] == r);
    CHECK(pp.ranks[1] - pp.ranks[0] == 8);
    // Independently: the local index in the stage is r mod 8; ep index = local mod 4.
    const int local = r % 8, stage = r / 8;
    const Group ep = mesh.ep_group(r);
    REQUIRE(ep.size() == 4);
    for (int e = 0; e < 4; ++e) CHECK(ep.ranks[e] == stage * 8 + local / 4 * 4 + e);
    const Group ep_shard = mesh.ep_shard_group(r);
    REQUIRE(ep_shard.size() == 2);
    for (int s = 0; s < 2; ++s) CHECK(ep_shard.ranks[s] == stage * 8 + s * 4 + local % 4);
  }
  std::map<std::string, std::multiset<int>> covered;
  std::vector<std::string> axes;
  for (const auto& g : mesh.all_groups()) {
    if (axes.empty() || axes.back() != g.axis) axes.push_back(g.axis);
    covered[g.axis].insert(g.ranks.begin(), g.ranks.end());
  }
  CHECK(axes == std::vector<std::string>{"dp_shard", "dp_replicate", "cp", "pp", "ep", "ep_shard"});
  std::multiset<int> all;
  for (int r = 0; r < 16; ++r) all.insert(r);
  for (const auto& [axis, ranks] : covered) {
    INFO(axis);
    CHECK(ranks == all);  // each axis's groups partition the world
  }
  // Axes of size 1 beyond dp_shard/dp_replicate are not listed.
  for (const auto& g : Mesh(mesh_config(4), "test.yaml").all_groups()) CHECK((g.axis == "dp_shard" || g.axis == "dp_replicate"));
}

TEST_CASE("plan cp: a CP rank holds its share of the row padded to cp x chunks (contiguous, load-balanced)",
          "[plan][cp]") {
  CHECK(cp_local_tokens(32, 1, 1) == 32);
  CHECK(cp_local_tokens(32, 2, 2) == 16);  // 4 chunks of 8, two per rank
  CHECK(cp_local_tokens(32, 3, 2) == 12);  // padded to 36: 6 chunks of 6
  CHECK(cp_local_tokens(32, 3, 1) == 11);  // padded to 33
  CHECK(cp_local_tokens(33, 2, 1) == 17);  // padded to 34
  CHECK(cp_local_tokens(1, 4, 2) == 2);    // padded to 8: one token and seven pad slots
  CHECK_THROWS_AS(cp_local_tokens(32, 0, 2), std::invalid_argument);
  CHECK_THROWS_AS(cp_local_tokens(32, 2, 0), std::invalid_argument);
  CHECK_THROWS_AS(cp_local_tokens(0, 2, 2), std::invalid_argument);
  CHECK(beam_sharding_rules().cp_chunks_per_rank == 2);  // §5.7: Beam's split is load-balanced
}

TEST_CASE("plan stages: layers split evenly, the first L mod pp stages one more, embeddings first, head last",
          "[plan][pp]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));  // 4 layers
  for (std::int64_t pp : {2, 3, 4}) {
    INFO("pp " << pp);
    MeshConfig c = mesh_config(2);
    c.pp = pp;
    const Plan plan = make_plan(model.specs(), beam_sharding_rules(), Mesh(c, "test.yaml"), Precision::bf16);
    std::map<std::int64_t, int> stage_of_layer;
    for (const auto& u : plan.units) {
      if (u.layer >= 0) {
        const auto [it, fresh] = stage_of_layer.emplace(u.layer, u.stage);
        CHECK(it->second == u.stage);  // a layer's islands and block share a stage
      }
      if (u.role == UnitRole::embedding) CHECK(u.stage == 0);
      if (u.role == UnitRole::head || u.role == UnitRole::root) CHECK(u.stage == pp - 1);
      // §5.2, §6.17: no unit reshards or prefetches with PP (none is gathered again per micro-batch).
      CHECK(u.schedule == GatherSchedule{false, 0, 0, u.role == UnitRole::island});
      CHECK(u.forward_prefetch_units.empty());
      CHECK(u.backward_prefetch_units.empty());
    }
    std::vector<int> per_stage(static_cast<std::size_t>(pp), 0);
    for (const auto& [layer, stage] : stage_of_layer) ++per_stage[static_cast<std::size_t>(stage)];
    for (int s = 0; s < pp; ++s) CHECK(per_stage[s] == 4 / pp + (s < 4 % pp ? 1 : 0));
    int previous = 0;
    for (const auto& [layer, stage] : stage_of_layer) {
      CHECK(stage >= previous);  // contiguous, in layer order
      previous = stage;
    }
    // Each stage's memory counts only its units: the stages' shards add up to the whole plan's.
    std::int64_t staged = 0;
    for (int s = 0; s < pp; ++s) staged += estimate_memory(plan, s).parameter_bytes;
    std::int64_t whole = 0;
    for (const auto& u : plan.units) whole += u.shard_numel * 4;
    CHECK(staged == whole);
  }
  MeshConfig too_many;
  too_many.pp = 5;
  try {
    make_plan(model.specs(), beam_sharding_rules(), Mesh(too_many, "test.yaml"), Precision::bf16);
    FAIL("5 stages for 4 layers were accepted");
  } catch (const ConfigError& e) {
    CHECK(e.key() == "topology.mesh.pp");
    CHECK(std::string(e.what()).find("at most 4 pipeline stages") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Unit formation

TEST_CASE("plan units: beam-tiny-moe has 11 units in forward order, one router island per layer",
          "[plan][units]") {
  const Plan plan = beam_plan("beam-tiny-moe");
  const std::vector<std::string> expected = {
      "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.0", "model.layers.1.mlp.gate",
      "model.layers.1",     "model.layers.2.mlp.gate", "model.layers.2", "model.layers.3.mlp.gate",
      "model.layers.3",     "model",                   "lm_head"};
  CHECK(unit_names(plan) == expected);
  for (std::int64_t l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const UnitPlan& island = plan.unit(p + ".mlp.gate");
    CHECK(island.role == UnitRole::island);
    CHECK(island.island);
    CHECK(island.layer == l);
    REQUIRE(island.params.size() == 2);
    CHECK(island.params[0].name == p + ".mlp.gate.weight");
    CHECK(island.params[1].name == p + ".mlp.gate.e_score_correction_bias");
    CHECK(island.numel == 8 * 64 + 8);
    const UnitPlan& block = plan.unit(p);
    CHECK(block.role == UnitRole::block);
    CHECK(block.layer == l);
    CHECK(&plan.unit_of_param(p + ".mlp.experts.down_projs") == &block);  // ep = 1: experts stay in the block
  }
  CHECK(plan.unit("model.embed_tokens").role == UnitRole::embedding);
  CHECK(plan.unit("model").role == UnitRole::root);
  REQUIRE(plan.unit("model").params.size() == 1);
  CHECK(plan.unit("model").params[0].name == "model.norm.weight");
  CHECK(plan.unit("lm_head").role == UnitRole::head);
  CHECK_THROWS_AS(plan.unit("model.layers.9"), std::out_of_range);
  CHECK_THROWS_AS(plan.unit_of_param("nope"), std::out_of_range);
}

TEST_CASE("plan units: beam-tiny-dense has 7 units and no islands", "[plan][units]") {
  const Plan plan = beam_plan("beam-tiny-dense");
  const std::vector<std::string> expected = {"model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                                             "model.layers.3",     "model",          "lm_head"};
  CHECK(unit_names(plan) == expected);
  for (const auto& u : plan.units) CHECK_FALSE(u.island);
  // mlp.gate_proj does not match the fp32 entry mlp.gate (matching is by whole path segments).
  CHECK(plan.unit_of_param("model.layers.0.mlp.gate_proj.weight").name == "model.layers.0");
}

TEST_CASE("plan units: every parameter is owned by exactly one unit, numel adds up", "[plan][units]") {
  for (const char* preset : {"beam-tiny-moe", "beam-tiny-dense", "beam-small"}) {
    INFO(preset);
    const BeamModel model(beam_preset(preset));
    const Plan plan = make_plan(model.specs(), beam_sharding_rules(), Mesh(mesh_config(3)), Precision::bf16);
    std::map<std::string, int> owners;
    std::int64_t numel = 0;
    for (const auto& u : plan.units) {
      CHECK_FALSE(u.params.empty());  // no empty unit
      numel += u.numel;
      for (const auto& p : u.params) ++owners[p.name];
    }
    CHECK(owners.size() == model.specs().size());
    for (const auto& s : model.specs()) {
      CHECK(owners[s.name] == 1);
      const UnitPlan& u = plan.unit_of_param(s.name);
      CHECK(u.island == s.island);  // dtype-uniform: islands hold exactly the island params
    }
    CHECK(numel == model.parameter_count());
  }
}

TEST_CASE("plan policies: islands f32, bulk bf16 in bf16 and f32 in fp32, Beam blocks do not cast inputs",
          "[plan][policy]") {
  for (Precision precision : {Precision::bf16, Precision::fp32}) {
    INFO(precision_name(precision));
    const DType bulk = precision == Precision::bf16 ? DType::bf16 : DType::f32;
    const Plan plan = beam_plan("beam-tiny-moe", 2, precision);
    CHECK(plan.precision == precision);
    for (const auto& u : plan.units) {
      INFO(u.name);
      CHECK(u.storage_dtype == DType::f32);
      CHECK(u.policy.reduce_dtype == DType::f32);
      switch (u.role) {
        case UnitRole::island:
          CHECK(u.policy == MixedPrecisionPolicy{DType::f32, DType::f32, DType::f32, false});
          break;
        case UnitRole::block:
          CHECK(u.policy == MixedPrecisionPolicy{bulk, DType::f32, bulk, false});
          break;
        case UnitRole::experts:
          FAIL("ep is 1: the experts stay in their block");
          break;
        case UnitRole::embedding:
        case UnitRole::root:
        case UnitRole::head:
          CHECK(u.policy == MixedPrecisionPolicy{bulk, DType::f32, bulk, true});
          break;
      }
      // The gather dtype is the compute dtype of every param the unit holds (one dtype per collective).
      const BeamModel model(beam_preset("beam-tiny-moe"));
      for (const auto& s : model.specs()) {
        if (plan.unit_of_param(s.name).name == u.name) CHECK(s.compute_dtype(precision) == u.policy.param_dtype);
      }
    }
  }
}

TEST_CASE("plan schedules: blocks reshard except the last, prefetch 1/2 along blocks, islands resident",
          "[plan][schedule]") {
  const Plan plan = beam_plan("beam-tiny-moe", 4);
  for (std::int64_t l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const UnitPlan& block = plan.unit(p);
    INFO(p);
    CHECK(block.schedule.reshard_after_forward == (l != 3));
    CHECK(block.schedule.forward_prefetch == 1);
    CHECK(block.schedule.backward_prefetch == 2);
    CHECK_FALSE(block.schedule.resident_for_step);
    const GatherSchedule island = plan.unit(p + ".mlp.gate").schedule;
    CHECK(island == GatherSchedule{false, 0, 0, true});
  }
  CHECK(plan.unit("model.layers.0").forward_prefetch_units == std::vector<std::string>{"model.layers.1"});
  CHECK(plan.unit("model.layers.3").forward_prefetch_units.empty());
  CHECK(plan.unit("model.layers.3").backward_prefetch_units ==
        std::vector<std::string>{"model.layers.2", "model.layers.1"});
  CHECK(plan.unit("model.layers.1").backward_prefetch_units == std::vector<std::string>{"model.layers.0"});
  CHECK(plan.unit("model.layers.0").backward_prefetch_units.empty());
  CHECK(plan.unit("model.embed_tokens").schedule == GatherSchedule{true, 0, 0, false});
  CHECK(plan.unit("model").schedule == GatherSchedule{false, 0, 0, false});
  CHECK(plan.unit("lm_head").schedule == GatherSchedule{false, 0, 0, false});

  // §6.17: backward re-gathers exactly the resharded units (the step program's gathers are
  // counted in tests/actors/test_step_program.cpp).
  std::vector<std::string> regathered;
  for (const auto& u : plan.units) {
    if (gathers_per_step(u) == 2) regathered.push_back(u.name);
  }
  CHECK(regathered ==
        std::vector<std::string>{"model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2"});
}

TEST_CASE("plan sharding: dim-0 chunks padded to ceil(rows / 3), flat shard = concatenation", "[plan][shard]") {
  const Plan plan = beam_plan("beam-tiny-moe", 3);
  for (const auto& u : plan.units) {
    INFO(u.name);
    CHECK(u.shard_count == 3);
    std::int64_t offset = 0;
    for (const auto& p : u.params) {
      INFO(p.name);
      CHECK(p.rows_per_rank == (p.rows + 2) / 3);
      CHECK(p.shard_offset == offset);
      CHECK(p.shard_numel == p.rows_per_rank * p.row_numel);
      CHECK(p.numel() == shape_numel(p.shape));
      std::int64_t covered = 0;
      for (int i = 0; i < 3; ++i) covered += p.rows_on(i);
      CHECK(covered == p.rows);
      offset += p.shard_numel;
    }
    CHECK(u.shard_numel == offset);
    CHECK(3 * u.shard_numel >= u.numel);
  }
  // Hand-computed: embed_tokens [256, 64] -> 86 rows per rank (86, 86, 84 real).
  const UnitParam& embed = plan.unit("model.embed_tokens").param("model.embed_tokens.weight");
  CHECK(embed.rows == 256);
  CHECK(embed.row_numel == 64);
  CHECK(embed.rows_per_rank == 86);
  CHECK(embed.rows_on(2) == 84);
  CHECK(plan.unit("model.embed_tokens").shard_numel == 86 * 64);
  // Router island: weight [8, 64] -> 3 rows; bias [8] -> 3 elements; 3 + 3 + 2 real rows.
  const UnitPlan& router = plan.unit("model.layers.0.mlp.gate");
  CHECK(router.param("model.layers.0.mlp.gate.weight").shard_numel == 3 * 64);
  CHECK(router.param("model.layers.0.mlp.gate.e_score_correction_bias").shard_offset == 3 * 64);
  CHECK(router.param("model.layers.0.mlp.gate.e_score_correction_bias").shard_numel == 3);
  CHECK(router.param("model.layers.0.mlp.gate.e_score_correction_bias").rows_on(2) == 2);
  CHECK(router.shard_numel == 3 * 64 + 3);
  // Experts [8, 64, 64]: dim 0 (the expert index) is sharded: 3 experts per rank.
  CHECK(plan.unit("model.layers.0").param("model.layers.0.mlp.experts.gate_and_up_projs").shard_numel == 3 * 64 * 64);
}

TEST_CASE("plan errors: a minority-dtype param that cannot be isolated is rejected by name", "[plan][errors]") {
  const Mesh mesh;
  FamilyShardingRules rules = beam_sharding_rules();
  const std::vector<ParamSpec> base = {spec("model.embed_tokens.weight", {16, 4}),
                                       spec("model.layers.0.mlp.gate.weight", {2, 4}, true),
                                       spec("model.layers.0.mlp.up_proj.weight", {8, 4}),
                                       spec("model.norm.weight", {4}), spec("lm_head.weight", {16, 4})};
  CHECK(make_plan(base, rules, mesh, Precision::bf16).units.size() == 5);

  auto message_of = [&](std::vector<ParamSpec> specs) -> std::string {
    try {
      make_plan(specs, rules, mesh, Precision::bf16);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  {  // an fp32 param directly in a bulk module (its module is not on the fp32 list)
    auto specs = base;
    specs.push_back(spec("model.layers.0.self_attn.sinks", {4}, true));
    const std::string m = message_of(specs);
    INFO(m);
    CHECK(m.find("'model.layers.0.self_attn.sinks'") != std::string::npos);
    CHECK(m.find("must be moved into its own submodule") != std::string::npos);
  }
  {  // a bulk param inside the fp32 router module
    auto specs = base;
    specs.push_back(spec("model.layers.0.mlp.gate.extra_proj.weight", {4, 4}));
    const std::string m = message_of(specs);
    INFO(m);
    CHECK(m.find("'model.layers.0.mlp.gate.extra_proj.weight'") != std::string::npos);
    CHECK(m.find("must be moved into its own submodule") != std::string::npos);
  }
  {  // fp32 params outside the layers that no fp32 entry names (fp32 precision does not excuse it)
    auto specs = base;
    specs[3].island = true;
    CHECK_THROWS_WITH(make_plan(specs, rules, mesh, Precision::fp32),
                      Catch::Contains("'model.norm.weight'") && Catch::Contains("own submodule"));
    specs = base;
    specs[4].island = true;  // Beam's head is bulk
    CHECK_THROWS_WITH(make_plan(specs, rules, mesh, Precision::bf16), Catch::Contains("'lm_head.weight'"));
  }
  {
    auto specs = base;
    specs.push_back(spec("model.norm.weight", {4}));
    CHECK_THROWS_WITH(make_plan(specs, rules, mesh, Precision::bf16), Catch::Contains("declared twice"));
  }
}

TEST_CASE("plan units: other families' island shapes (model-level islands, fp32 head, checkpoint wrappers)",
          "[plan][units]") {
  FamilyShardingRules rules;
  rules.family = "test";
  rules.fp32_modules = {"_fp32_params", "output_query", "lm_head"};
  rules.head_is_island = true;
  const std::vector<ParamSpec> specs = {
      spec("model.embed_tokens.weight", {16, 4}),
      spec("model.layers.0._checkpoint_wrapped_module.self_attn._fp32_params.sinks", {2}, true),
      spec("model.layers.0._checkpoint_wrapped_module.self_attn.q_proj.weight", {4, 4}),
      spec("model.layers.1.self_attn._fp32_params.sinks", {2}, true),
      spec("model.layers.1.self_attn.q_proj.weight", {4, 4}),
      spec("model.output_query.weight", {4}, true),
      spec("model.norm.weight", {4}),
      spec("lm_head.weight", {16, 4}, true)};
  const Plan plan = make_plan(specs, rules, Mesh(), Precision::bf16);
  const std::vector<std::string> expected = {"model.embed_tokens",
                                             "model.layers.0._checkpoint_wrapped_module.self_attn._fp32_params",
                                             "model.layers.0",
                                             "model.layers.1.self_attn._fp32_params",
                                             "model.layers.1",
                                             "model.output_query",
                                             "model",
                                             "lm_head"};
  CHECK(unit_names(plan) == expected);
  CHECK(plan.unit("model.output_query").role == UnitRole::island);
  CHECK(plan.unit("model.output_query").layer == -1);
  CHECK(plan.unit("lm_head").role == UnitRole::head);
  CHECK(plan.unit("lm_head").policy == island_policy());
  CHECK(plan.unit("model.layers.0").policy.cast_forward_inputs);  // the rules do not say blocks cast themselves
  CHECK_FALSE(plan.unit("model.layers.1").schedule.reshard_after_forward);
}

// ---------------------------------------------------------------------------------------------
// Flat shards

TEST_CASE("flat shards: pack every shard, gather, unpack == original bitwise (d = 3, shapes that do not divide)",
          "[plan][flat]") {
  const std::vector<ParamSpec> odd = {spec("model.norm.weight", {5}),      spec("model.scale", {}),
                                      spec("model.a.weight", {7, 3}),      spec("model.b.weight", {2, 2, 2}),
                                      spec("model.c.weight", {3, 5}),      spec("model.d.weight", {1, 4})};
  const BeamModel model(beam_preset("beam-tiny-moe"));
  for (const auto* specs : {&odd, &model.specs()}) {
    const Plan plan = make_plan(*specs, beam_sharding_rules(), Mesh(mesh_config(3)), Precision::bf16);
    const TensorMap full = TensorMap::initialized(*specs, 7, 1.0f);
    for (const auto& u : plan.units) {
      INFO(u.name);
      const Tensor gathered = gather_all(u, full);
      const TensorMap unpacked = unpack_gathered(u, gathered, 3);
      REQUIRE(unpacked.names().size() == u.params.size());
      for (const auto& p : u.params) {
        INFO(p.name);
        CHECK(same_bits(unpacked.at(p.name), full.at(p.name)));
        CHECK(unpacked.at(p.name).shape() == full.at(p.name).shape());
      }
      // The reduce-scatter input is the same concatenation.
      CHECK(same_bits(pack_for_reduce_scatter(u, full, 3), gathered));
      // Padding is zero; unpack_shard returns exactly each shard's real rows.
      for (int i = 0; i < 3; ++i) {
        const Tensor shard = pack_shard(u, full, i, 3);
        const TensorMap rows = unpack_shard(u, shard, i, 3);
        for (const auto& p : u.params) {
          const float* s = shard.data<float>() + p.shard_offset;
          const std::int64_t real = p.rows_on(i) * p.row_numel;
          for (std::int64_t k = real; k < p.shard_numel; ++k) CHECK(s[k] == 0.0f);
          const Tensor& owned = rows.at(p.name);
          CHECK(owned.numel() == real);
          CHECK(std::memcmp(owned.raw(), full.at(p.name).data<float>() + p.first_row(i) * p.row_numel,
                            static_cast<std::size_t>(real) * 4) == 0);
        }
      }
    }
  }
  // Every shard of a [2, 2, 2] param over 3 ranks: rows 1, 1, 0 (the last is all padding).
  const Plan plan = make_plan(odd, beam_sharding_rules(), Mesh(mesh_config(3)), Precision::bf16);
  const UnitParam& b = plan.unit("model").param("model.b.weight");
  CHECK(b.rows_per_rank == 1);
  CHECK(b.rows_on(2) == 0);
  CHECK(plan.unit("model").param("model.scale").rows == 1);
  CHECK(plan.unit("model").param("model.scale").rows_on(1) == 0);
}

TEST_CASE("flat shards: a fresh model generated shard by shard equals the packed full model bitwise",
          "[plan][shard]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  const TensorMap full = TensorMap::initialized(model.specs(), 17, 0.02f);
  for (std::int64_t d : {1, 2, 3, 4, 7}) {  // 3 and 7 leave padding in most chunks
    INFO("shard count " << d);
    const Plan plan = make_plan(model.specs(), beam_sharding_rules(), Mesh(mesh_config(d), "test.yaml"), Precision::bf16);
    for (const UnitPlan& unit : plan.units) {
      for (int i = 0; i < static_cast<int>(d); ++i) {
        INFO(unit.name << " shard " << i);
        const Tensor generated = init_shard(unit, model.specs(), 17, 0.02f, i);
        const Tensor packed = pack_shard(unit, full, i, static_cast<int>(d));
        REQUIRE(generated.numel() == packed.numel());
        CHECK(std::memcmp(generated.raw(), packed.raw(), generated.bytes()) == 0);
      }
    }
  }
}

TEST_CASE("flat shards: a bf16 gather unpacks to the bf16-rounded params exactly, bad inputs are named",
          "[plan][flat]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  const Plan plan = make_plan(model.specs(), beam_sharding_rules(), Mesh(mesh_config(3)), Precision::bf16);
  const TensorMap full = TensorMap::initialized(model.specs(), 11, 0.02f);
  const UnitPlan& block = plan.unit("model.layers.1");
  const Tensor gathered_bf16 = gather_all(block, full).to(DType::bf16);
  const TensorMap unpacked = unpack_gathered(block, gathered_bf16, 3);
  for (const auto& p : block.params) {
    Tensor expected = full.at(p.name).clone();
    round_to_bf16_inplace(expected);
    CHECK(same_bits(unpacked.at(p.name), expected));
  }
  CHECK_THROWS_WITH(pack_shard(block, full, 0, 2), Catch::Contains("laid out for 3 shards"));
  CHECK_THROWS_WITH(pack_shard(block, full, 3, 3), Catch::Contains("shard index 3"));
  CHECK_THROWS_WITH(unpack_gathered(block, Tensor::zeros({5}), 3), Catch::Contains("model.layers.1"));
  TensorMap missing;
  CHECK_THROWS_WITH(pack_shard(block, missing, 0, 3), Catch::Contains("no tensor for parameter"));
}

// ---------------------------------------------------------------------------------------------
// Memory and printing

TEST_CASE("plan memory: shards cover the model, optimizer 2x, peak gathered under the schedule", "[plan][memory]") {
  const BeamModel model(beam_preset("beam-tiny-moe"));
  const std::int64_t full_bytes = model.parameter_count() * 4;
  for (int d : {1, 2, 3, 4}) {
    INFO("dp_shard " << d);
    const Plan plan = beam_plan("beam-tiny-moe", d, Precision::bf16);
    const MemoryEstimate m = estimate_memory(plan);
    CHECK(m.parameter_bytes * plan.mesh.world_size() >= full_bytes);
    if (d == 1) CHECK(m.parameter_bytes == full_bytes);
    CHECK(m.gradient_bytes == m.parameter_bytes);
    CHECK(m.optimizer_bytes == 2 * m.parameter_bytes);
    CHECK(m.total_bytes() == 4 * m.parameter_bytes + m.peak_gathered_bytes);

    // The peak: backward of the last block holds all islands (f32), the last block and the two
    // blocks it prefetches (bf16).
    std::int64_t islands = 0;
    for (const auto& u : plan.units) {
      if (u.island) islands += gathered_bytes(u);
    }
    CHECK(m.peak_at == "backward of model.layers.3");
    CHECK(m.peak_gathered_bytes == islands + gathered_bytes(plan.unit("model.layers.3")) +
                                       gathered_bytes(plan.unit("model.layers.2")) +
                                       gathered_bytes(plan.unit("model.layers.1")));
    CHECK(gathered_bytes(plan.unit("model.layers.0.mlp.gate")) == static_cast<std::int64_t>(d) * plan.unit("model.layers.0.mlp.gate").shard_numel * 4);
    CHECK(gathered_bytes(plan.unit("model.layers.0")) == static_cast<std::int64_t>(d) * plan.unit("model.layers.0").shard_numel * 2);

    // Traffic: resharded units twice, islands and kept units once.
    for (std::size_t i = 0; i < plan.units.size(); ++i) {
      const UnitPlan& u = plan.units[i];
      CHECK(m.units[i].name == u.name);
      CHECK(m.units[i].bytes_gathered_per_step == gathered_bytes(u) * (u.schedule.reshard_after_forward ? 2 : 1));
    }
  }
}

namespace {

struct ProgramPeak {
  std::int64_t bytes = 0;
  std::string at;  // the first compute instruction that holds it: "<kind> of <op>"
};

// A program's gathered-bytes peak from each unit's live intervals (a gather's position to its
// release's, or to the end), summed at every compute instruction: written apart from
// estimate_memory's running set.
ProgramPeak replay_peak(const Plan& plan, const StepProgram& program) {
  struct Live {
    std::size_t from, to;
    std::int64_t bytes;
  };
  std::vector<Live> intervals;
  const auto& ins = program.instructions;
  for (std::size_t g = 0; g < ins.size(); ++g) {
    if (ins[g].kind != StepInstructionKind::gather) continue;
    std::size_t r = g + 1;
    while (r < ins.size() && !(ins[r].kind == StepInstructionKind::release && ins[r].unit == ins[g].unit)) ++r;
    intervals.push_back({g, r, gathered_bytes(plan.units[ins[g].unit])});
  }
  ProgramPeak peak;
  for (std::size_t p = 0; p < ins.size(); ++p) {
    const bool compute = ins[p].is_compute() || ins[p].kind == StepInstructionKind::expert_forward ||
                         ins[p].kind == StepInstructionKind::expert_backward;
    if (!compute) continue;
    std::int64_t live = 0;
    for (const Live& l : intervals) live += l.from < p && p < l.to ? l.bytes : 0;
    if (live > peak.bytes) {
      peak.bytes = live;
      peak.at = std::string(step_instruction_name(ins[p].kind)) + " of " + program.ops.at(ins[p].op).name;
    }
  }
  return peak;
}

}  // namespace

// Given the step program, the peak is what the program holds at once: its gathers and releases
// replayed (here once more, from live intervals), observed at every compute instruction. Under expert
// parallelism a layer's block stays gathered while its experts run (the combine op reads it),
// which the unit walk missed (one block low).
TEST_CASE("plan memory: with the step program, the peak is what its ops hold together, a block with its experts",
          "[plan][memory]") {
  for (const auto& [family, preset] : std::vector<std::pair<std::string, std::string>>{
           {"beam", "beam-tiny-moe"}, {"flint", "flint-tiny"}, {"inkling2", "inkling2-tiny"}}) {
    ModelSection section;
    section.family = family;
    section.preset = preset;
    const auto model = make_model(section, "test.yaml");
    for (const std::int64_t ep : {1, 2, 4}) {
      for (const std::int64_t replicate : {1, 2}) {
        INFO(preset << " ep " << ep << " dp_replicate " << replicate);
        MeshConfig config = mesh_config(4, replicate);
        config.ep = ep;
        const Plan plan = make_plan(model->specs(), model->sharding_rules(), Mesh(config, "test.yaml"), Precision::bf16);
        const StepProgram program = compile_step_program(plan, model->ops(), 2);
        const MemoryEstimate m = estimate_memory(plan, 0, &program);
        // Whether the program runs an experts op with its layer's block gathered (the combine op
        // reads the block after it).
        std::set<std::size_t> held;
        bool block_with_experts = false;
        for (const StepInstruction& in : program.instructions) {
          if (in.kind == StepInstructionKind::gather) held.insert(in.unit);
          if (in.kind == StepInstructionKind::release) held.erase(in.unit);
          if (in.kind != StepInstructionKind::expert_forward && in.kind != StepInstructionKind::expert_backward) continue;
          for (std::size_t u : held) {
            block_with_experts = block_with_experts || (plan.units[u].role == UnitRole::block &&
                                                        plan.units[u].layer == program.ops.at(in.op).layer);
          }
        }
        // A floor from the plan alone: the resident islands, and the biggest block with its experts.
        std::int64_t islands = 0, block_and_experts = 0;
        for (const UnitPlan& u : plan.units) {
          if (u.schedule.resident_for_step) islands += gathered_bytes(u);
          if (u.role != UnitRole::experts) continue;
          for (const UnitPlan& b : plan.units) {
            if (b.role == UnitRole::block && b.layer == u.layer) {
              block_and_experts = std::max(block_and_experts, gathered_bytes(b) + gathered_bytes(u));
            }
          }
        }
        CHECK(m.peak_gathered_bytes >= islands + block_and_experts);
        // Exact, for one and two micro-batches: the replay below gives the same peak and place.
        std::int64_t all_units = 0;
        for (const UnitPlan& u : plan.units) all_units += gathered_bytes(u);
        const StepProgram one = compile_step_program(plan, model->ops(), 1);
        const ProgramPeak replay_one = replay_peak(plan, one), replay_two = replay_peak(plan, program);
        const MemoryEstimate m_one = estimate_memory(plan, 0, &one);
        CHECK(m_one.peak_gathered_bytes == replay_one.bytes);
        CHECK(m_one.peak_at == replay_one.at);
        CHECK(m.peak_gathered_bytes == replay_two.bytes);
        CHECK(m.peak_at == replay_two.at);
        // Releases matter: with one micro-batch every layer but the last reshards after forward,
        // so the peak never holds every unit. (With two, the first micro-batch's backward keeps
        // every unit gathered for the second, FSDP2's accumulation: the peak is all of them.)
        CHECK(m_one.peak_gathered_bytes < all_units);
        CHECK(m.peak_gathered_bytes == all_units);
        // The peak repeats from the second micro-batch on (the preflight compiles two).
        for (const StepSchedule schedule : {StepSchedule::one_at_a_time, StepSchedule::all_forward_first}) {
          const StepProgram five = compile_step_program(plan, model->ops(), 5, schedule);
          const StepProgram two = compile_step_program(plan, model->ops(), 2, schedule);
          CHECK(estimate_memory(plan, 0, &five).peak_gathered_bytes == estimate_memory(plan, 0, &two).peak_gathered_bytes);
        }
        const MemoryEstimate walk = estimate_memory(plan);
        CHECK(m.parameter_bytes == walk.parameter_bytes);
        // Every layer reshards after forward but the last, its experts included (MODELS.md §5.2).
        std::int64_t last = -1;
        for (const UnitPlan& u : plan.units) last = std::max(last, u.layer);
        for (const UnitPlan& u : plan.units) {
          if (u.role != UnitRole::block && u.role != UnitRole::experts) continue;
          INFO(u.name);
          CHECK(u.schedule.reshard_after_forward == (u.layer != last));
        }
        if (ep > 1) {
          CHECK(block_with_experts);
          CHECK(m.peak_gathered_bytes > walk.peak_gathered_bytes);
        }
      }
    }
  }
}

TEST_CASE("format_plan: one row per unit, each router island its own fp32 row, mesh, groups, memory",
          "[plan][format]") {
  const Plan plan = beam_plan("beam-tiny-moe", 4);
  const std::string text = format_plan(plan);
  INFO(text);
  for (int l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    // unit, role, params, elements, storage, param, reduce, inputs, shard/rank, gathered/step, schedule
    const auto island = cells_of(line_of(text, p + ".mlp.gate "));
    REQUIRE(island.size() == 11);
    CHECK(island[1] == "island");
    CHECK(island[2] == "2");
    CHECK(island[3] == "520");  // 8*64 + 8
    CHECK(island[4] == "f32");
    CHECK(island[5] == "f32");
    CHECK(island[6] == "f32");
    CHECK(island[7] == "as is");
    CHECK(island[8] == "130");  // 2*64 + 2
    CHECK(island[9] == "2.0 KiB");  // gathered once: 4 * 130 * 4 bytes
    CHECK(island[10] == "resident for step");
    const auto block = cells_of(line_of(text, p + " "));
    REQUIRE(block.size() == 11);
    CHECK(block[1] == "block");
    CHECK(block[5] == "bf16");
    CHECK(block[6] == "f32");
    CHECK(block[7] == "as is");
    CHECK(block[10] == (l == 3 ? "keep until backward, fwd prefetch 1, bwd prefetch 2"
                               : "reshard, fwd prefetch 1, bwd prefetch 2"));
  }
  const auto embed = cells_of(line_of(text, "model.embed_tokens "));
  REQUIRE(embed.size() == 11);
  CHECK(embed[7] == "cast");
  CHECK(embed[10] == "reshard");
  CHECK(text.find("plan: 11 units (4 fp32 islands), precision bf16") != std::string::npos);
  CHECK(text.find("mesh: pp 1 x dp_replicate 1 x dp_shard 4 x cp 1 (ep 1) = 4 ranks") != std::string::npos);
  CHECK(text.find("dp_shard[0,1,2,3]") != std::string::npos);
  CHECK(text.find("dp_replicate[3]") != std::string::npos);
  CHECK(text.find("optimizer state") != std::string::npos);
  CHECK(text.find("peak gathered parameters") != std::string::npos);
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(3 * 1024 * 1024) == "3.0 MiB");
}

TEST_CASE("op graph metas: every activation an op reads or writes has its tensors, and nothing else does",
          "[plan][ops]") {
  for (const auto& [family, preset] : std::vector<std::pair<std::string, std::string>>{
           {"beam", "beam-tiny-moe"}, {"beam", "beam-tiny-dense"}, {"flint", "flint-tiny"}, {"inkling2", "inkling2-tiny"}}) {
    INFO(preset);
    ModelSection section;
    section.family = family;
    section.preset = preset;
    const auto model = make_model(section, "test.yaml");
    const auto metas = model->activation_metas(2, 16);
    std::set<std::string> named;
    for (const OpSpec& op : model->ops()) {
      for (const auto* list : {&op.inputs, &op.outputs}) {
        for (const std::string& a : *list) {
          INFO(op.name << ": " << a);
          CHECK(metas.count(a) == 1);
          named.insert(a);
        }
      }
    }
    for (const auto& [name, tensors] : metas) {
      INFO(name);
      CHECK(named.count(name) == 1);
      for (const TensorMeta& t : tensors) CHECK(shape_numel(t.shape) > 0);
    }
    CHECK(metas.at("input_ids") == std::vector<TensorMeta>{{"input_ids", {2, 16}, DType::i64}});
    CHECK(metas.at("logits").at(0).shape == Shape{32, model->vocab_size()});
  }
}

TEST_CASE("op graph metas: a tensor fits its meta by dtype and shape, dispatched rows up to their bound",
          "[plan][ops]") {
  const std::vector<TensorMeta> rows = {{"x_rows", {8, 4}, DType::f32, true}, {"w_rows", {8}, DType::f32, true}};
  CHECK(meta_mismatch({Tensor::zeros({8, 4}), Tensor::zeros({8})}, rows).empty());
  CHECK(meta_mismatch({Tensor::zeros({5, 4}), Tensor::zeros({5})}, rows).empty());  // masked tokens: fewer rows
  CHECK(meta_mismatch({Tensor::zeros({9, 4}), Tensor::zeros({9})}, rows) ==
        "tensor 0 is f32[9, 4] where the op graph says x_rows f32<=[8, 4]");
  const std::vector<TensorMeta> hidden = {{"hidden", {6, 4}, DType::f32}};
  CHECK(meta_mismatch({Tensor::zeros({5, 4})}, hidden) == "tensor 0 is f32[5, 4] where the op graph says hidden f32[6, 4]");
  CHECK_FALSE(meta_mismatch({Tensor::zeros({6, 4}, DType::i64)}, hidden).empty());
  CHECK_FALSE(meta_mismatch({Tensor::zeros({24})}, hidden).empty());  // same size, other rank
  CHECK_FALSE(meta_mismatch({Tensor()}, hidden).empty());
  CHECK(meta_mismatch({}, hidden) == "0 tensor(s) where the op graph says 1");
}
