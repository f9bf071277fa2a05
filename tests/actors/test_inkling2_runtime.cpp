// Inkling2 on the actor runtime against the reference trainer (same approach as
// test_actor_runtime.cpp for Beam): the residual state travels between ops inside one
// MicroBatchRun, the per-layer islands (depth queries, clip scales, router) and the model-level
// output_query island are gathered in fp32, everything else in bf16.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <map>

#include "actors/actor_engine.hpp"
#include "graph/data/data_source.hpp"
#include "graph/models/model.hpp"
#include "graph/reference/trainer.hpp"
#include "tests/actors/actor_test_support.hpp"

using namespace atl;
using namespace atl::testing;

namespace {

RunConfig inkling2_config(const std::string& preset, Precision precision, Layout layout, std::int64_t global_batch) {
  return parity_config("inkling2", preset, precision, layout, global_batch);
}

}  // namespace

TEST_CASE("Inkling2 on the actor runtime matches the reference trainer on dp / hsdp layouts",
          "[actors][parity][inkling2]") {
  // 8 micro-batches: (1,1) (2,1) (2,2) own aligned power-of-two blocks of them, so the pairwise
  // tree is reproduced exactly (bitwise); dp_shard 3 gets 6 micro-batches and parameters whose dim 0
  // does not divide by 3 ([64]-row tensors, [4, 4] conv taps, [8, 17] relative tables): within 1e-5
  // in fp32, 1e-2 in bf16.
  struct Case {
    Layout layout;
    std::int64_t global_batch;
    bool bitwise;
  };
  const std::vector<Case> cases = {{{1, 1}, 8, true}, {{2, 1}, 8, true}, {{2, 2}, 8, true}, {{3, 1}, 6, false}};
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    std::map<std::int64_t, RunOutput> reference;
    for (std::int64_t gb : {6, 8}) {
      reference[gb] = run_engine(inkling2_config("inkling2-tiny", precision, {}, gb), make_reference_engine, 10);
    }
    for (const Case& c : cases) {
      INFO(precision_name(precision) << " dp_shard " << c.layout.dp_shard << " dp_replicate " << c.layout.dp_replicate);
      const RunOutput& ref = reference[c.global_batch];
      RunOutput act = run_engine(inkling2_config("inkling2-tiny", precision, c.layout, c.global_batch), make_actor_engine, 10);
      REQUIRE(act.steps.size() == ref.steps.size());
      CHECK(same_routing(act.steps[0].routing, ref.steps[0].routing));
      REQUIRE(ref.steps[0].routing.size() == static_cast<std::size_t>(c.global_batch));
      CHECK(ref.steps[0].routing[0].size() == 4);  // every layer is an MoE layer
      const double tolerance = precision == Precision::fp32 ? 1e-5 : 1e-2;
      check_same_steps(act, ref, tolerance, c.bitwise);
      CHECK(max_relative_param_diff(act.master, ref.master) <= tolerance);
      if (c.bitwise) CHECK(bitwise_equal(act.master, ref.master));
    }
    // The run trains: the loss after 10 steps is below the first, and the zero-initialised depth
    // queries (attn_query, mlp_query, output_query) have moved.
    CHECK(reference[8].steps.back().loss < reference[8].steps.front().loss);
    for (const char* name : {"layers.3.attn_query.weight", "layers.0.mlp_query.weight", "output_query.weight"}) {
      double sum = 0;
      for (float v : reference[8].master.at(name).span<float>()) sum += std::abs(v);
      INFO(name);
      CHECK(sum > 0);
    }
  }
}

TEST_CASE("Inkling2-tiny-deep on the actor runtime matches the reference bitwise on (2,1)",
          "[actors][parity][inkling2]") {
  const RunOutput ref = run_engine(inkling2_config("inkling2-tiny-deep", Precision::bf16, {}, 8), make_reference_engine, 4);
  const RunOutput act = run_engine(inkling2_config("inkling2-tiny-deep", Precision::bf16, {2, 1}, 8), make_actor_engine, 4);
  check_same_steps(act, ref, 1e-2, true);  // bf16: bitwise, and within bf16's tolerance a fortiori
  CHECK(bitwise_equal(act.master, ref.master));
}

TEST_CASE("Inkling2 collectives: depth queries, clip scales, routers and output_query gather fp32",
          "[actors][record][inkling2]") {
  std::unique_ptr<TrainingEngine> engine;
  run_engine(inkling2_config("inkling2-tiny", Precision::bf16, {2, 1}, 2), make_actor_engine, 2, true, &engine);
  auto& actors = dynamic_cast<ActorEngine&>(*engine);
  const Plan& plan = actors.plan();
  std::map<std::string, int> gathers, reductions;
  for (const CollectiveRecord& rec : actors.collective_records()) {
    // The step's report (i64) and the state export between steps (step -1) are not unit traffic.
    if (rec.axis == "world" || rec.step < 1) continue;
    const UnitPlan& unit = plan.unit(rec.tag);
    INFO(rec.tag);
    if (rec.kind == CollectiveKind::all_gather) {
      CHECK(rec.dtype == (unit.island ? DType::f32 : DType::bf16));
      ++gathers[rec.tag];
    } else {
      CHECK(rec.kind == CollectiveKind::reduce_scatter);
      CHECK(rec.dtype == DType::f32);
      ++reductions[rec.tag];
    }
  }
  for (const char* island : {"output_query", "layers.1.attn_query", "layers.3.attn_query", "layers.0.mlp_query",
                             "layers.2.self_attn.q_l2_clip", "layers.2.self_attn.rel_l2_clip", "layers.2.mlp.gate"}) {
    INFO(island);
    CHECK(plan.unit(island).island);
    CHECK(gathers[island] > 0);
    CHECK(reductions[island] == reductions["layers.3"]);  // reduced every step, as the bulk blocks are
  }
  CHECK_FALSE(plan.unit("lm_head").island);
  CHECK(gathers["lm_head"] > 0);
  CHECK(gathers["embed_norm"] > 0);
  CHECK(gathers["layers.3"] > 0);
  CHECK(reductions["layers.3"] > 0);
}
