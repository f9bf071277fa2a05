// Flint on the actor runtime against the reference trainer (same approach as
// test_actor_runtime.cpp for Beam), and Flint's two kinds of fp32 island units on the wire: the
// per-layer sink holders and the lm_head.
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

RunConfig flint_config(Precision precision, Layout layout, std::int64_t global_batch) {
  return parity_config("flint", "flint-tiny", precision, layout, global_batch);
}

}  // namespace

TEST_CASE("Flint on the actor runtime matches the reference trainer on dp / hsdp layouts", "[actors][parity][flint]") {
  // 8 micro-batches: (1,1) (2,1) (2,2) own aligned power-of-two blocks of them, so the pairwise
  // tree is reproduced exactly (bitwise); dp_shard 3 gets 6 micro-batches and parameters whose dim 0
  // does not divide by 3 (the sinks [4], every [64]-row tensor): within 1e-5 in fp32, 1e-2 in bf16.
  struct Case {
    Layout layout;
    std::int64_t global_batch;
    bool bitwise;
  };
  const std::vector<Case> cases = {{{1, 1}, 8, true}, {{2, 1}, 8, true}, {{2, 2}, 8, true}, {{3, 1}, 6, false}};
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    std::map<std::int64_t, RunOutput> reference;
    for (std::int64_t gb : {6, 8}) reference[gb] = run_engine(flint_config(precision, {}, gb), make_reference_engine, 10);
    for (const Case& c : cases) {
      INFO(precision_name(precision) << " dp_shard " << c.layout.dp_shard << " dp_replicate " << c.layout.dp_replicate);
      const RunOutput& ref = reference[c.global_batch];
      RunOutput act = run_engine(flint_config(precision, c.layout, c.global_batch), make_actor_engine, 10);
      REQUIRE(act.steps.size() == ref.steps.size());
      CHECK(same_routing(act.steps[0].routing, ref.steps[0].routing));
      REQUIRE(ref.steps[0].routing.size() == static_cast<std::size_t>(c.global_batch));
      CHECK(ref.steps[0].routing[0].size() == 4);  // sparse layers 2..5
      const double tolerance = precision == Precision::fp32 ? 1e-5 : 1e-2;
      check_same_steps(act, ref, tolerance, c.bitwise);
      CHECK(max_relative_param_diff(act.master, ref.master) <= tolerance);
      if (c.bitwise) CHECK(bitwise_equal(act.master, ref.master));
    }
    // The run trains: the loss after 10 steps is below the first.
    CHECK(reference[8].steps.back().loss < reference[8].steps.front().loss);
  }
}

TEST_CASE("Flint collectives: sink holders and lm_head gather fp32, bulk units bf16, reductions fp32",
          "[actors][record][flint]") {
  std::unique_ptr<TrainingEngine> engine;
  run_engine(flint_config(Precision::bf16, {2, 1}, 2), make_actor_engine, 2, true, &engine);
  auto& actors = dynamic_cast<ActorEngine&>(*engine);
  const Plan& plan = actors.plan();
  std::map<std::string, int> gathers;
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
    }
  }
  CHECK(plan.unit("lm_head").island);
  CHECK(gathers["lm_head"] > 0);
  CHECK(gathers["model.layers.0.self_attn._fp32_params"] > 0);
  CHECK(gathers["model.layers.5.self_attn._fp32_params"] > 0);
  CHECK(gathers["model.layers.3"] > 0);  // bulk block with the router weight
  CHECK_FALSE(plan.unit("model.layers.3").island);
}
