// The comm actor on its own: its stream runs every number once, and a number asked for again
// (a numbering bug) is an error for every request it holds, never a request left unanswered.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/spawn.hpp"
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
