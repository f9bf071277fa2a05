// The ucx backend's transport (issue 11, first part): every collective over UCX tag messages
// between 4 workers of this process (loopback), bitwise equal to the sim backend on the same
// inputs, with overlapping groups in flight at once and records like the sim's.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <map>
#include <random>
#include <thread>

#include "comm/sim/sim_world.hpp"
#include "comm/rendezvous/tcp_rendezvous.hpp"
#include "comm/ucx/peer_ends.hpp"
#include "comm/ucx/ucx_world.hpp"
#include "kernels/tensor.hpp"
#include "tests/comm/fired.hpp"

using namespace atl;
using atl::testing::Fired;

namespace {

Tensor random_tensor(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor t = Tensor::empty({n});
  for (float& v : t.span<float>()) v = dist(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// Runs `post(communicator, member, done)` for every member of `group` on a backend and waits.
using Post = std::function<void(Communicator&, int, Completion)>;
void run_on(const std::vector<std::unique_ptr<Communicator>>& comms, const Post& post) {
  Fired latch;
  for (std::size_t m = 0; m < comms.size(); ++m) post(*comms[m], static_cast<int>(m), latch.tick());
  REQUIRE(latch.wait_for(static_cast<int>(comms.size())));
}

struct Backends {
  SimWorld sim{4};
  UcxWorld ucx{4, {0, 1, 2, 3}};
  Backends() { ucx.connect(ucx.local_addresses()); }
  template <class World>
  static std::vector<std::unique_ptr<Communicator>> communicators(World& w, const Group& g) {
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r : g.ranks) out.push_back(w.communicator(g, r));
    return out;
  }
};

// Members 0 and 1 of a group in one connected world whose on_transfer_failure action, after a
// 10 ms grace, is noted.
struct WatchedPair {
  UcxWorld world{2, {0, 1}};
  std::shared_ptr<std::promise<TransferFailure>> fired = std::make_shared<std::promise<TransferFailure>>();
  std::future<TransferFailure> ran = fired->get_future();
  std::unique_ptr<Communicator> member0, member1;
  WatchedPair() {
    world.connect(world.local_addresses());
    world.on_transfer_failure(std::chrono::milliseconds(10),
                              [fired = fired](TransferFailure kind) { fired->set_value(kind); });
    const Group pair{"pair", {0, 1}};
    member0 = world.communicator(pair, 0);
    member1 = world.communicator(pair, 1);
  }
  // Whether the action ran (a deadlock watchdog, not a timing claim).
  bool failure_action_ran() { return ran.wait_for(std::chrono::seconds(120)) == std::future_status::ready; }
  TransferFailure failure() { return ran.get(); }
};

}  // namespace

TEST_CASE("ucx: every collective over UCX equals the sim backend bit for bit", "[comm][ucx]") {
  Backends b;
  const Group world{"world", {0, 1, 2, 3}};
  auto sim = Backends::communicators(b.sim, world);
  auto ucx = Backends::communicators(b.ucx, world);
  // 1000 elements: all_reduce chunks of 250; 1001: chunks of unequal size.
  for (std::int64_t n : {1000, 1001}) {
    INFO("n " << n);
    // Inputs per member, and one output set per backend.
    std::vector<Tensor> inputs, full_inputs;
    for (int m = 0; m < 4; ++m) {
      inputs.push_back(random_tensor(n, 10 + static_cast<std::uint32_t>(m)));
      full_inputs.push_back(random_tensor(4 * n, 20 + static_cast<std::uint32_t>(m)));
    }
    auto compare = [&](const char* what, const std::function<Tensor(Communicator&, int, Completion, bool)>& post) {
      INFO(what);
      std::vector<Tensor> out_sim(4), out_ucx(4);
      run_on(sim, [&](Communicator& c, int m, Completion done) { out_sim[static_cast<std::size_t>(m)] = post(c, m, done, false); });
      run_on(ucx, [&](Communicator& c, int m, Completion done) { out_ucx[static_cast<std::size_t>(m)] = post(c, m, done, true); });
      for (int m = 0; m < 4; ++m) CHECK(same_bits(out_sim[static_cast<std::size_t>(m)], out_ucx[static_cast<std::size_t>(m)]));
    };
    compare("all_gather", [&](Communicator& c, int m, Completion done, bool) {
      Tensor out = Tensor::empty({4 * n});
      c.all_gather(inputs[static_cast<std::size_t>(m)], out, "t", std::move(done));
      return out;
    });
    compare("reduce_scatter", [&](Communicator& c, int m, Completion done, bool) {
      Tensor out = Tensor::empty({n});
      c.reduce_scatter(full_inputs[static_cast<std::size_t>(m)], out, "t", std::move(done));
      return out;
    });
    compare("all_reduce", [&](Communicator& c, int m, Completion done, bool) {
      Tensor inout = inputs[static_cast<std::size_t>(m)].clone();
      c.all_reduce(inout, "t", std::move(done));
      return inout;
    });
    compare("broadcast from member 2", [&](Communicator& c, int m, Completion done, bool) {
      Tensor inout = inputs[static_cast<std::size_t>(m)].clone();
      c.broadcast(inout, 2, "t", std::move(done));
      return inout;
    });
    compare("all_to_all_v", [&](Communicator& c, int m, Completion done, bool) {
      // Member i sends (i + j) % 3 elements to member j (some blocks empty).
      std::vector<std::int64_t> send_counts, recv_counts;
      std::int64_t send_total = 0, recv_total = 0;
      for (int j = 0; j < 4; ++j) {
        send_counts.push_back((m + j) % 3);
        recv_counts.push_back((j + m) % 3);
        send_total += send_counts.back();
        recv_total += recv_counts.back();
      }
      Tensor send = inputs[static_cast<std::size_t>(m)].slice_rows(0, send_total).clone();
      Tensor out = Tensor::empty({recv_total});
      c.all_to_all_v(send, send_counts, out, recv_counts, "t", std::move(done));
      return out;
    });
  }
  // The records: one per rank per collective, like the sim's.
  CHECK(b.ucx.recorder()->records().size() == b.sim.recorder()->records().size());
}

TEST_CASE("ucx: reductions of many chunks (summed as they arrive) equal the sim's, two at once on a group",
          "[comm][ucx]") {
  // The UCX reductions travel in 256 KiB chunks through a few staging slots per member; these
  // sizes span several chunks with a partial last one, over a 3-member group (a tree that is not a
  // power of two), with a reduce_scatter and an all_reduce of the same group in flight together.
  Backends b;
  const Group trio{"trio", {0, 1, 3}};
  auto sim = Backends::communicators(b.sim, trio);
  auto ucx = Backends::communicators(b.ucx, trio);
  const std::int64_t n = 2 * 65536 + 5001, total = 3 * (5 * 65536 / 2) + 2;
  auto run = [&](const std::vector<std::unique_ptr<Communicator>>& comms) {
    std::vector<Tensor> scattered, reduced;
    Fired latch;
    for (int m = 0; m < 3; ++m) {
      scattered.push_back(Tensor::empty({n}));
      reduced.push_back(random_tensor(total, 40 + static_cast<std::uint32_t>(m)));
      comms[static_cast<std::size_t>(m)]->reduce_scatter(random_tensor(3 * n, 30 + static_cast<std::uint32_t>(m)),
                                                         scattered.back(), "rs", latch.tick());
      comms[static_cast<std::size_t>(m)]->all_reduce(reduced.back(), "ar", latch.tick());
    }
    REQUIRE(latch.wait_for(6));
    return std::pair{scattered, reduced};
  };
  const auto [sim_rs, sim_ar] = run(sim);
  const auto [ucx_rs, ucx_ar] = run(ucx);
  for (std::size_t m = 0; m < 3; ++m) {
    CHECK(same_bits(sim_rs[m], ucx_rs[m]));
    CHECK(same_bits(sim_ar[m], ucx_ar[m]));
  }
  // A sum of three normals is no normal: the check is not comparing inputs with themselves.
  CHECK_FALSE(same_bits(ucx_rs[0], random_tensor(3 * n, 30).slice_rows(0, n).clone()));
}

TEST_CASE("ucx: reductions with empty parts (fewer elements than members, none at all) equal the sim's",
          "[comm][ucx]") {
  Backends b;
  const Group world{"world", {0, 1, 2, 3}};
  auto sim = Backends::communicators(b.sim, world);
  auto ucx = Backends::communicators(b.ucx, world);
  for (std::int64_t n : {0, 1, 2, 3}) {
    INFO("n " << n);
    auto run = [&](const std::vector<std::unique_ptr<Communicator>>& comms) {
      std::vector<Tensor> reduced, scattered;
      Fired latch;
      for (int m = 0; m < 4; ++m) {
        // all_reduce of n elements over 4 members: some members own an empty range.
        reduced.push_back(random_tensor(n, 60 + static_cast<std::uint32_t>(m)));
        comms[static_cast<std::size_t>(m)]->all_reduce(reduced.back(), "ar", latch.tick());
        // reduce_scatter of n elements per member (n = 0: nothing to sum anywhere).
        scattered.push_back(Tensor::empty({n}));
        comms[static_cast<std::size_t>(m)]->reduce_scatter(random_tensor(4 * n, 70 + static_cast<std::uint32_t>(m)),
                                                           scattered.back(), "rs", latch.tick());
      }
      REQUIRE(latch.wait_for(8));
      return std::pair{reduced, scattered};
    };
    const auto [sim_ar, sim_rs] = run(sim);
    const auto [ucx_ar, ucx_rs] = run(ucx);
    for (std::size_t m = 0; m < 4; ++m) {
      CHECK(same_bits(sim_ar[m], ucx_ar[m]));
      CHECK(same_bits(sim_rs[m], ucx_rs[m]));
    }
  }
}

TEST_CASE("ucx: a reduction whose chunks already wait at the receiver sums them in order", "[comm][ucx]") {
  // Every message eager (UCX_RNDV_THRESH=inf, shared memory): member 1's chunks reach member 0
  // before member 0 posts its receives, so receives complete while they are posted. Chunks must
  // still be received into their own slots in order (3.5 chunks per member, 2 staging slots).
  ::setenv("UCX_RNDV_THRESH", "inf", 1);
  UcxWorld ucx(2, {0, 1}, nullptr, /*peer_errors=*/false);
  ::unsetenv("UCX_RNDV_THRESH");
  ucx.connect(ucx.local_addresses());
  SimWorld sim(2);
  const Group pair{"pair", {0, 1}}, side{"side", {0, 1}};
  const std::int64_t n = 3 * 65536 + 32768;
  const std::vector<Tensor> inputs = {random_tensor(2 * n, 50), random_tensor(2 * n, 51)};
  auto reduce = [&](auto& world, bool member_1_first) {
    auto c0 = world.communicator(pair, 0), c1 = world.communicator(pair, 1);
    std::vector<Tensor> out = {Tensor::empty({n}), Tensor::empty({n})};
    Fired latch;
    c1->reduce_scatter(inputs[1], out[1], "rs", latch.tick());
    if (member_1_first) {  // a message behind member 1's chunks: once it is in, they are too
      auto s0 = world.communicator(side, 0), s1 = world.communicator(side, 1);
      Fired side_latch;
      Tensor got = Tensor::empty({1});
      s0->recv(got, 1, "after", side_latch.tick());
      s1->send(Tensor::full({1}, 1.0f), 0, "after", side_latch.tick());
      REQUIRE(side_latch.wait_for(2));
    }
    c0->reduce_scatter(inputs[0], out[0], "rs", latch.tick());
    REQUIRE(latch.wait_for(2));
    return out;
  };
  const auto expected = reduce(sim, false);
  for (int round = 0; round < 3; ++round) {
    const auto got = reduce(ucx, true);
    CHECK(same_bits(got[0], expected[0]));
    CHECK(same_bits(got[1], expected[1]));
  }
}

TEST_CASE("ucx: overlapping groups in flight at once keep their messages apart, send/recv pair in order",
          "[comm][ucx]") {
  Backends b;
  const Group pair_a{"dp_shard", {0, 1}}, pair_b{"dp_shard", {2, 3}}, stride{"dp_replicate", {0, 2}};
  auto a = Backends::communicators(b.ucx, pair_a);
  auto bb = Backends::communicators(b.ucx, pair_b);
  auto s = Backends::communicators(b.ucx, stride);
  Fired latch;
  // Rank 0 is in pair_a and stride: both all-reduces in flight together, twice each.
  std::vector<Tensor> a_bufs, s_bufs;
  for (int round = 0; round < 2; ++round) {
    for (int m = 0; m < 2; ++m) {
      a_bufs.push_back(Tensor::full({257}, static_cast<float>(1 + m + 10 * round)));
      s_bufs.push_back(Tensor::full({257}, static_cast<float>(100 + m + 10 * round)));
      a[static_cast<std::size_t>(m)]->all_reduce(a_bufs.back(), "a", latch.tick());
      s[static_cast<std::size_t>(m)]->all_reduce(s_bufs.back(), "s", latch.tick());
    }
  }
  // Point to point inside pair_b: three messages, received in the order sent.
  std::vector<Tensor> got;
  for (int k = 0; k < 3; ++k) {
    got.push_back(Tensor::empty({5}));
    bb[1]->recv(got.back(), 0, "p", latch.tick());
  }
  for (int k = 0; k < 3; ++k) bb[0]->send(Tensor::full({5}, static_cast<float>(k)), 1, "p", latch.tick());
  REQUIRE(latch.wait_for(8 + 6));
  for (int round = 0; round < 2; ++round) {
    for (int m = 0; m < 2; ++m) {
      CHECK(a_bufs[static_cast<std::size_t>(2 * round + m)].data<float>()[256] == static_cast<float>(3 + 20 * round));
      CHECK(s_bufs[static_cast<std::size_t>(2 * round + m)].data<float>()[0] == static_cast<float>(201 + 20 * round));
    }
  }
  for (int k = 0; k < 3; ++k) CHECK(got[static_cast<std::size_t>(k)].data<float>()[4] == static_cast<float>(k));
  CHECK_THROWS_AS(b.ucx.communicator(pair_a, 2), std::invalid_argument);  // not a member
  // A member must keep as many elements for itself as it receives from itself (else its own block
  // would overrun): refused before anything is posted, as the sim refuses it.
  CHECK_THROWS_WITH(a[0]->all_to_all_v(Tensor::zeros({2}), {1, 1}, Tensor::zeros({2}), {2, 0}, "x", [] {}),
                    Catch::Contains("as many elements to itself as from itself"));
  // Two groups whose descriptions hash to one 24-bit tag id (found by search): refused.
  b.ucx.communicator(Group{"g4201", {0, 1}}, 0);
  b.ucx.communicator(Group{"g4201", {0, 1}}, 1);  // the same group again is fine
  CHECK_THROWS_WITH(b.ucx.communicator(Group{"g6702", {0, 1}}, 0),
                    "ucx: groups g4201[0,1] and g6702[0,1] have the same 24-bit tag id; their messages could not be "
                    "told apart");
}

// Both backends apply comm/collective_checks.hpp: a call the sim refuses, UCX refuses with the same
// message (but for the backend's name), before anything is posted. (The sim stages its inputs and
// would cope with overlapping buffers; UCX sends from send while receiving into recv.)
TEST_CASE("ucx and sim refuse the same bad collectives with the same messages", "[comm][ucx]") {
  Backends b;
  const Group pair{"pair", {0, 1}};
  auto sim = Backends::communicators(b.sim, pair);
  auto ucx = Backends::communicators(b.ucx, pair);
  const Tensor send = Tensor::zeros({4});
  using Call = std::function<void(Communicator&, Completion)>;
  const std::vector<std::pair<Call, std::string>> cases = {
      {[](Communicator& c, Completion d) { c.all_gather(Tensor::zeros({2}), Tensor::zeros({3}), "t", d); },
       "all_gather in group pair[0,1] (rank 0, tag 't'): recv must have send's dtype and group size (2) times its "
       "elements; got send f32[2], recv f32[3]"},
      {[&](Communicator& c, Completion d) { c.all_gather(send.slice_rows(2, 4), send, "t", d); },
       "all_gather in group pair[0,1] (rank 0, tag 't'): send must lie apart from recv, or be exactly recv's "
       "block 0 (this member's)"},
      {[](Communicator& c, Completion d) { c.all_gather(Tensor{}, Tensor::zeros({4}), "t", d); },
       "all_gather in group pair[0,1] (rank 0, tag 't'): send is undefined"},
      {[](Communicator& c, Completion d) {
         c.reduce_scatter(Tensor::zeros({4}, DType::bf16), Tensor::zeros({2}, DType::bf16), "t", d);
       },
       "reduce_scatter in group pair[0,1] (rank 0, tag 't'): only f32 reductions are supported, got bf16[4]"},
      {[&](Communicator& c, Completion d) { c.reduce_scatter(send, send.slice_rows(1, 3), "t", d); },
       "reduce_scatter in group pair[0,1] (rank 0, tag 't'): recv must lie apart from send, or be exactly send's "
       "block 0 (this member's)"},
      {[&](Communicator& c, Completion d) { c.reduce_scatter(send, send.slice_rows(2, 4), "t", d); },
       "recv must lie apart from send, or be exactly send's block 0"},
      {[](Communicator& c, Completion d) { c.all_reduce(Tensor::zeros({2}, DType::i64), "t", d); },
       "all_reduce in group pair[0,1] (rank 0, tag 't'): only f32 reductions are supported, got i64[2]"},
      {[](Communicator& c, Completion d) { c.broadcast(Tensor::zeros({2}), 2, "t", d); },
       "broadcast in group pair[0,1] (rank 0, tag 't'): root 2 is not a member index in [0, 2)"},
      {[](Communicator& c, Completion d) { c.send(Tensor::zeros({2}), 0, "t", d); },
       "send in group pair[0,1] (rank 0, tag 't'): peer 0 is not another member's index in [0, 2) (this member "
       "is 0)"},
      {[](Communicator& c, Completion d) { c.recv(Tensor::zeros({2}), -1, "t", d); },
       "recv in group pair[0,1] (rank 0, tag 't'): peer -1 is not another member's index"},
      {[](Communicator& c, Completion d) {
         c.all_to_all_v(Tensor::zeros({2}), {1}, Tensor::zeros({2}), {1, 1}, "t", d);
       },
       "all_to_all_v in group pair[0,1] (rank 0, tag 't'): send_counts has 1 entries, expected one per member (2)"},
      {[](Communicator& c, Completion d) {
         c.all_to_all_v(Tensor::zeros({2}), {3, -1}, Tensor::zeros({2}), {1, 1}, "t", d);
       },
       "send_counts [3,-1] is negative"},
      {[](Communicator& c, Completion d) {
         c.all_to_all_v(Tensor::zeros({2}), {1, 1}, Tensor::zeros({3}), {1, 1}, "t", d);
       },
       "recv_counts [1,1] sum to 2 but recv is f32[3]"},
      {[&](Communicator& c, Completion d) { c.all_to_all_v(send, {2, 2}, send, {2, 2}, "t", d); },
       "all_to_all_v in group pair[0,1] (rank 0, tag 't'): send and recv must not overlap"},
      {[](Communicator& c, Completion d) {
         c.all_to_all_v(Tensor::zeros({2}), {1, 1}, Tensor::zeros({2}), {2, 0}, "t", d);
       },
       "sends 1 elements to itself but receives 2 (expected as many elements to itself as from itself)"},
  };
  Fired fired;
  for (const auto& [call, expected] : cases) {
    INFO(expected);
    std::string messages[2];
    for (int backend = 0; backend < 2; ++backend) {
      Communicator& c = backend == 0 ? *sim[0] : *ucx[0];
      try {
        call(c, fired.tick());
      } catch (const std::invalid_argument& e) {
        messages[backend] = e.what();
      }
    }
    REQUIRE(messages[0].rfind("sim comm ", 0) == 0);  // refused, by the sim
    REQUIRE(messages[1].rfind("ucx comm ", 0) == 0);  // and by UCX
    CHECK(messages[0].substr(std::string("sim").size()) == messages[1].substr(std::string("ucx").size()));
    CHECK(messages[0].find(expected) != std::string::npos);
  }
  // In place means this member's own block: member 1's is block 1, not block 0.
  for (Communicator* c : {sim[1].get(), ucx[1].get()}) {
    CHECK_THROWS_WITH(c->reduce_scatter(send, send.slice_rows(0, 2), "t", fired.tick()),
                      Catch::Contains("(rank 1, tag 't'): recv must lie apart from send, or be exactly send's block 1"));
    CHECK_THROWS_WITH(c->all_gather(send.slice_rows(0, 2), send, "t", fired.tick()),
                      Catch::Contains("send must lie apart from recv, or be exactly recv's block 1"));
  }
  CHECK(fired.count() == 0);
}

TEST_CASE("rendezvous: the first differing key of two job descriptions", "[comm][rendezvous]") {
  CHECK(first_difference(R"({"a":1,"b":{"c":2}})", R"({"a":1,"b":{"c":2}})").empty());
  CHECK(first_difference(R"({"a":1,"b":{"c":2,"d":3}})", R"({"a":1,"b":{"c":5,"d":4}})") == "b.c");
  CHECK(first_difference(R"({"a":[1,2]})", R"({"a":[1,3]})") == "a[1]");
  CHECK(first_difference(R"({"a":1})", R"({"a":1,"z":0})") == "z");
  CHECK(first_difference(R"({"a":"x"})", R"({"a":1})") == "a");
}

TEST_CASE("ucx: many collectives in flight on overlapping groups from every rank's thread equal the sim's",
          "[comm][ucx]") {
  // Each rank posts, from its own thread, a stream of all_gathers, reduce_scatters and
  // all_to_all_vs alternating between its dp_shard pair, its stride pair and the world, without
  // waiting for earlier ones (as a comm actor does); every result must equal the sim backend's.
  constexpr int kOps = 60;
  SimWorld sim(4);
  UcxWorld ucx(4, {0, 1, 2, 3});
  ucx.connect(ucx.local_addresses());
  const std::vector<Group> groups = {Group{"dp_shard", {0, 1}}, Group{"dp_shard", {2, 3}},
                                     Group{"dp_replicate", {0, 2}}, Group{"dp_replicate", {1, 3}},
                                     Group{"world", {0, 1, 2, 3}}};
  auto run = [&](auto& world) {
    std::vector<std::map<std::string, std::unique_ptr<Communicator>>> comms(4);
    for (const Group& g : groups) {
      for (int r : g.ranks) comms[static_cast<std::size_t>(r)][g.axis] = world.communicator(g, r);
    }
    std::vector<std::vector<Tensor>> outputs(4);
    Fired fired;
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        for (int k = 0; k < kOps; ++k) {
          const char* axis = k % 3 == 0 ? "dp_shard" : k % 3 == 1 ? "dp_replicate" : "world";
          Communicator& c = *comms[static_cast<std::size_t>(r)][axis];
          const int size = c.group().size(), me = c.group_index();
          const std::int64_t n = 1 + (k * 37) % 300;
          Tensor in = random_tensor(n * size, static_cast<std::uint32_t>(1000 * k + r));
          if (k % 4 == 3) {  // a reduction of several chunks (the pipelined path) now and then
            const std::int64_t rows = 65536 + 911 * k;
            Tensor out = Tensor::empty({rows});
            c.reduce_scatter(random_tensor(rows * size, static_cast<std::uint32_t>(3 * k + r)), out, "s", fired.tick());
            outputs[static_cast<std::size_t>(r)].push_back(out);
          } else if (k % 2 == 0) {
            Tensor out = Tensor::empty({n * size * size});
            Tensor send = in.slice_rows(0, n * size);
            c.all_gather(send, out, "s", fired.tick());
            outputs[static_cast<std::size_t>(r)].push_back(out);
          } else {
            std::vector<std::int64_t> sc, rc;
            for (int j = 0; j < size; ++j) {
              sc.push_back((me + j + k) % 4 * 3);
              rc.push_back((j + me + k) % 4 * 3);
            }
            std::int64_t st = 0, rt = 0;
            for (int j = 0; j < size; ++j) {
              st += sc[static_cast<std::size_t>(j)];
              rt += rc[static_cast<std::size_t>(j)];
            }
            Tensor send = random_tensor(st, static_cast<std::uint32_t>(7 * k + r));
            Tensor out = Tensor::empty({rt});
            c.all_to_all_v(send, sc, out, rc, "s", fired.tick());
            outputs[static_cast<std::size_t>(r)].push_back(out);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    REQUIRE(fired.wait_for(4 * kOps));
    return outputs;
  };
  const auto expected = run(sim);
  const auto got = run(ucx);
  for (int r = 0; r < 4; ++r) {
    for (int k = 0; k < kOps; ++k) {
      INFO("rank " << r << " op " << k);
      CHECK(same_bits(expected[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)],
                      got[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)]));
    }
  }
}

TEST_CASE("ucx: a transfer that fails with this process alive runs the on_transfer_failure action after its grace",
          "[comm][ucx]") {
  // Two worlds of one rank each stand for two nodes; the second goes away without a goodbye, as
  // a node whose data network failed looks to the first (nothing else would end the wait).
  auto a = std::make_unique<UcxWorld>(2, std::vector<int>{0});
  auto b = std::make_unique<UcxWorld>(2, std::vector<int>{1});
  std::map<int, WorkerAddress> all = a->local_addresses();
  for (const auto& [rank, address] : b->local_addresses()) all[rank] = address;
  a->connect(all);
  b->connect(all);
  auto fired = std::make_shared<std::promise<TransferFailure>>();
  std::future<TransferFailure> ran = fired->get_future();
  a->on_transfer_failure(std::chrono::milliseconds(100), [fired](TransferFailure kind) { fired->set_value(kind); });
  const Group pair{"pair", {0, 1}};
  std::unique_ptr<Communicator> from_a = a->communicator(pair, 0);
  b.reset();
  auto sent = std::make_shared<std::atomic<bool>>(false);
  from_a->send(Tensor::full({1 << 20}, 1.0f), 1, "t", [sent] { *sent = true; });
  // A deadlock watchdog, not a timing claim: UCX notices the peer within its keepalive.
  REQUIRE(ran.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
  CHECK(ran.get() == TransferFailure::broken);  // a restart may help: exit 1
  CHECK_FALSE(*sent);  // the failed send never completes: only the action ends the wait
}

TEST_CASE("ucx: an exception on the progress thread is a reported failure, not the end of the process",
          "[comm][ucx]") {
  // A send before connect() finds no endpoint (std::out_of_range on the progress thread): the
  // guard turns it into a failure of the world, whose action runs; the send never completes.
  UcxWorld world(2, {0, 1});
  auto fired = std::make_shared<std::promise<void>>();
  std::future<void> ran = fired->get_future();
  world.on_transfer_failure(std::chrono::milliseconds(10), [fired](TransferFailure) { fired->set_value(); });
  std::unique_ptr<Communicator> member0 = world.communicator(Group{"pair", {0, 1}}, 0);
  auto sent = std::make_shared<std::atomic<bool>>(false);
  member0->send(Tensor::full({4}, 1.0f), 1, "t", [sent] { *sent = true; });
  REQUIRE(ran.wait_for(std::chrono::seconds(120)) == std::future_status::ready);  // a hang detector
  CHECK_FALSE(*sent);
}

TEST_CASE("ucx: a disagreement after another failure still ends the job as a disagreement", "[comm][ucx]") {
  // A broken transfer first (a send before connect() finds no endpoint), then a message of another
  // size than its receive expects, within the grace: the processes disagree (exit 2, no restart),
  // whatever failed before.
  UcxWorld world(2, {0, 1});
  auto fired = std::make_shared<std::promise<TransferFailure>>();
  std::future<TransferFailure> ran = fired->get_future();
  world.on_transfer_failure(std::chrono::seconds(2), [fired](TransferFailure kind) { fired->set_value(kind); });
  std::unique_ptr<Communicator> early = world.communicator(Group{"early", {0, 1}}, 0);
  early->send(Tensor::full({4}, 1.0f), 1, "t", [] {});
  world.connect(world.local_addresses());
  const Group pair{"pair", {0, 1}};
  std::unique_ptr<Communicator> member0 = world.communicator(pair, 0), member1 = world.communicator(pair, 1);
  member1->recv(Tensor::full({8}, -1.0f), 0, "t", [] {});
  member0->send(Tensor::full({4}, 1.0f), 1, "t", [] {});
  REQUIRE(ran.wait_for(std::chrono::seconds(120)) == std::future_status::ready);  // a hang detector
  CHECK(ran.get() == TransferFailure::disagreement);
}

TEST_CASE("ucx: all_to_all_v members that disagree about an empty block fail the exchange, never complete it",
          "[comm][ucx]") {
  // Empty blocks travel as empty messages, so the receive's size check sees a disagreement either
  // way: a block where member 0 expects none (it would complete, the block left unmatched), and
  // none where member 0 expects one (it would wait with nothing said).
  struct Case {
    const char* what;
    std::vector<std::int64_t> recv_counts_0, send_counts_1;
  };
  for (const Case& c : {Case{"a block where none is expected", {1, 0}, {1, 1}},
                        Case{"no block where one is expected", {1, 1}, {0, 1}}}) {
    INFO(c.what);
    WatchedPair w;
    Communicator &member0 = *w.member0, &member1 = *w.member1;
    auto done0 = std::make_shared<std::atomic<bool>>(false);
    const auto total = [](const std::vector<std::int64_t>& counts) { return counts[0] + counts[1]; };
    member0.all_to_all_v(Tensor::full({2}, 1.0f), {1, 1}, Tensor::full({total(c.recv_counts_0)}, -1.0f),
                         c.recv_counts_0, "a2a", [done0] { *done0 = true; });
    member1.all_to_all_v(Tensor::full({total(c.send_counts_1)}, 2.0f), c.send_counts_1, Tensor::full({2}, -1.0f),
                         {1, 1}, "a2a", [] {});
    REQUIRE(w.failure_action_ran());
    CHECK(w.failure() == TransferFailure::disagreement);  // different builds or plans: exit 2, no restart
    CHECK_FALSE(*done0);
  }
}

TEST_CASE("ucx: a message of another size than its receive expects fails the receive, never completes it",
          "[comm][ucx]") {
  // Processes that disagree about a collective (different builds or plans): a shorter message
  // would leave the rest of the buffer stale, a longer one is truncated. Either way the receive
  // does not complete, and the failure action ends the job.
  for (const std::int64_t sent_floats : {4, 16}) {
    INFO("sent " << sent_floats << " floats to a receive of 8");
    WatchedPair w;
    auto received = std::make_shared<std::atomic<bool>>(false);
    w.member1->recv(Tensor::full({8}, -1.0f), 0, "t", [received] { *received = true; });
    w.member0->send(Tensor::full({sent_floats}, 1.0f), 1, "t", [] {});
    REQUIRE(w.failure_action_ran());
    CHECK(w.failure() == TransferFailure::disagreement);
    CHECK_FALSE(*received);
  }
}

TEST_CASE("ucx: a peer that said goodbye is owed nothing, one whose end is only expected still gets the flush",
          "[comm][ucx]") {
  PeerEnds ends;
  ends.said_goodbye({2, 3});
  ends.end_expected({4, 5});
  CHECK_FALSE(ends.owed_flush(2));
  CHECK(ends.owed_flush(4));  // this process ending the job: its last sends to node 2 may be on their way
  CHECK(ends.owed_flush(6));
  CHECK(ends.explains(3));
  CHECK(ends.explains(5));
  CHECK_FALSE(ends.explains(6));
  CHECK_FALSE(ends.explains(PeerEnds::kNoPeer));

  CHECK(ends.note_failure(5));  // the first failure is said
  CHECK_FALSE(ends.failure_unexplained());
  CHECK_FALSE(ends.note_failure(7));
  CHECK(ends.failure_unexplained());
  ends.said_goodbye({7});  // its goodbye arrived after its endpoint broke: explained since
  CHECK_FALSE(ends.failure_unexplained());
  ends.note_failure(PeerEnds::kNoPeer);  // a receive that failed: no end explains it
  CHECK(ends.failure_unexplained());
}
