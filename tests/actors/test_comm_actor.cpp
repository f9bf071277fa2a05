// The comm actor on its own: its stream runs every number once, and a number asked for again
// (a numbering bug) is an error for every request it holds, never a request left unanswered. And a
// unit actor on it, asked to gather twice.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/spawn.hpp"
#include "actors/trace.hpp"
#include "graph/config.hpp"
#include "graph/models/model.hpp"
#include "graph/plan/plan.hpp"
#include "comm/sim/sim_world.hpp"

using namespace atl;

namespace {

// Collective `seq` of the stream: an all-reduce tagged "t<seq>".
CollectiveRequest all_reduce(std::uint64_t seq) {
  CollectiveRequest r;
  r.seq = seq;
  r.axis = "world";
  r.kind = CollectiveKind::all_reduce;
  r.recv = Tensor::full({4}, 1.0f);
  r.tag = std::to_string(seq);
  r.tag.insert(r.tag.begin(), 't');  // (assigning "t" trips GCC 12's -Wrestrict false positive)
  return r;
}

// The answer to one collect request, or its error's text.
std::string ask(caf::scoped_actor& self, const comm_actor& comm, std::uint64_t seq) {
  std::string answer;
  self->request(comm, caf::infinite, collect_atom::value, all_reduce(seq))
      .receive([&](done_atom) { answer = "done"; }, [&](caf::error& e) { answer = self->system().render(e); });
  return answer;
}

// A comm actor over a 1-rank world group (its collectives complete at once).
comm_actor one_rank_comm(caf::actor_system& system, SimWorld& world) {
  std::vector<std::unique_ptr<Communicator>> communicators;
  communicators.push_back(world.communicator(Group{"world", {0}}, 0));
  return spawn_comm_actor(system, std::move(communicators));
}

}  // namespace

TEST_CASE("comm actor: a collective number asked for twice fails instead of waiting forever", "[actors][comm]") {
  caf::actor_system_config config;
  caf::actor_system system{config};
  SimWorld world(1);
  caf::scoped_actor self{system};
  SECTION("a number already issued") {
    const comm_actor comm = one_rank_comm(system, world);
    CHECK(ask(self, comm, 0) == "done");
    CHECK(ask(self, comm, 1) == "done");
    const std::string again = ask(self, comm, 1);
    CHECK(again.find("collective #1 (t1) was asked for twice") != std::string::npos);
    CHECK(again.find("stream is at #2") != std::string::npos);
    CHECK(ask(self, comm, 2) != "done");  // the actor ended with the error
  }
  SECTION("a number still held (waiting for an earlier one): both requests fail") {
    const comm_actor comm = one_rank_comm(system, world);
    self->send(comm, collect_atom::value, all_reduce(1));  // #0 has not come: held
    const std::string again = ask(self, comm, 1);
    CHECK(again.find("collective #1 (t1) was asked for twice") != std::string::npos);
    CHECK(again.find("stream is at #0") != std::string::npos);
    std::string held;
    self->receive([&](done_atom) { held = "done"; }, [&](caf::error& e) { held = self->system().render(e); },
                  caf::after(std::chrono::seconds(120)) >> [&] { held = "no answer"; });  // a hang detector
    CHECK(held.find("was asked for twice") != std::string::npos);
  }
}

TEST_CASE("unit actor: a gather asked of a gathered unit fails it, and what waited on it, by name", "[actors][unit]") {
  // The step program gathers only sharded units; a unit that skipped the second gather would leave
  // that collective unissued and every rank's stream waiting on it.
  caf::actor_system_config config;
  caf::actor_system system{config};
  SimWorld world(1);
  caf::scoped_actor self{system};
  const std::shared_ptr<const Model> model = make_model(ModelSection{"beam", "beam-tiny-moe", {}}, "test.yaml");
  MeshConfig mesh;
  auto plan = std::make_shared<const Plan>(
      make_plan(model->specs(), model->sharding_rules(), Mesh(mesh, "test.yaml"), Precision::fp32));
  const UnitPlan& unit = plan->units.at(0);
  std::vector<std::unique_ptr<Communicator>> communicators;
  communicators.push_back(world.communicator(Group{"dp_shard", {0}}, 0));
  UnitActorSetup setup;
  setup.plan = plan;
  setup.unit_index = 0;
  setup.comm = spawn_comm_actor(system, std::move(communicators));
  setup.initial_shard = Tensor::zeros({unit.shard_numel});
  setup.initial_exp_avg = Tensor::zeros({unit.shard_numel});
  setup.initial_exp_avg_sq = Tensor::zeros({unit.shard_numel});
  setup.weight_decay.assign(unit.params.size(), true);
  setup.tracer = std::make_shared<SpanTracer>(SpanTracer::Clock::now(), false);
  const unit_actor actor = spawn_unit_actor(system, std::move(setup));
  self->monitor(actor);
  const CollectiveNode first{0, CollectiveOp::all_gather, "dp_shard", unit.name};
  self->send(actor, gather_atom::value, first);
  bool gathered = false;
  self->request(actor, caf::infinite, params_atom::value)
      .receive([&](const GatheredParams& p) { gathered = p.params != nullptr; }, [&](caf::error&) {});
  REQUIRE(gathered);
  const CollectiveNode second{1, CollectiveOp::all_gather, "dp_shard", unit.name};
  self->send(actor, gather_atom::value, second);
  std::string reason = "(the unit did not fail)";
  self->receive([&](const caf::down_msg& down) { reason = system.render(down.reason); },
                caf::after(std::chrono::seconds(60)) >> [&] { self->send_exit(actor, caf::exit_reason::kill); });
  CHECK(reason.find("unit " + unit.name + ": gather #1 of a unit that is already gathered") != std::string::npos);
}
