// The in-process sim backend: collective semantics with 1-4 ranks on their own threads,
// reduction-order independence, mismatch detection, injected delays, records, long chains.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_record.hpp"
#include "comm/sim/sim_world.hpp"
#include "tests/comm/fired.hpp"
#include "kernels/tensor.hpp"

using namespace atl;
using atl::testing::Fired;
using namespace std::chrono_literals;

namespace {


// A group of `n` members whose global ranks are not their member indices: member i is global
// rank n - 1 - i, in a world one rank larger than the group.
Group reversed_group(int n, const std::string& axis = "dp_shard") {
  Group g{axis, {}};
  for (int i = 0; i < n; ++i) g.ranks.push_back(n - 1 - i);
  return g;
}

std::vector<std::unique_ptr<Communicator>> communicators(SimWorld& world, const Group& group) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r : group.ranks) out.push_back(world.communicator(group, r));
  return out;
}

// Runs body(member) on one thread per member, each starting after a member-specific jitter so
// posting orders vary between members and runs.
void run_members(int n, std::uint32_t seed, const std::function<void(int, std::mt19937&)>& body) {
  std::vector<std::thread> threads;
  for (int m = 0; m < n; ++m) {
    threads.emplace_back([&, m] {
      std::mt19937 rng(seed * 131u + static_cast<std::uint32_t>(m));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      body(m, rng);
    });
  }
  for (auto& t : threads) t.join();
}

void jitter(std::mt19937& rng) {
  if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
  else std::this_thread::yield();
}

Tensor filled_f32(std::int64_t n, const std::function<float(std::int64_t)>& f) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (std::int64_t k = 0; k < n; ++k) t.data<float>()[k] = f(k);
  return t;
}

Tensor filled_i64(std::int64_t n, const std::function<std::int64_t(std::int64_t)>& f) {
  Tensor t = Tensor::empty({n}, DType::i64);
  for (std::int64_t k = 0; k < n; ++k) t.data<std::int64_t>()[k] = f(k);
  return t;
}

// The pairwise tree of kernels/tree_sum.hpp written out recursively:
// tree(lo, n) = tree(lo, p) + tree(lo + p, n - p), p the largest power of two below n.
float explicit_tree(const std::vector<float>& x, std::size_t lo, std::size_t n) {
  if (n == 1) return x[lo];
  std::size_t p = 1;
  while (p * 2 < n) p *= 2;
  return explicit_tree(x, lo, p) + explicit_tree(x, lo + p, n - p);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("sim comm: communicators know their rank and group", "[comm][sim]") {
  SimWorld world(4);
  Group g{"ep", {3, 1}};
  auto c = world.communicator(g, 1);
  CHECK(c->rank() == 1);
  CHECK(c->group() == g);
  CHECK(c->group_index() == 1);
  CHECK_THROWS_AS(world.communicator(g, 0), std::invalid_argument);              // not a member
  CHECK_THROWS_AS(world.communicator(Group{"ep", {0, 4}}, 0), std::invalid_argument);  // outside the world
  CHECK_THROWS_AS(world.communicator(Group{"ep", {0, 0}}, 0), std::invalid_argument);  // repeated rank
  CHECK_THROWS_AS(world.communicator(Group{"ep", {}}, 0), std::invalid_argument);
  CHECK(std::string(collective_name(CollectiveKind::all_to_all_v)) == "all_to_all_v");
  CHECK(std::string(collective_name(CollectiveKind::recv)) == "recv");
}

TEST_CASE("sim comm: all_gather concatenates in member order for 1-4 ranks", "[comm][sim]") {
  for (int n = 1; n <= 4; ++n) {
    for (std::uint32_t seed = 0; seed < 3; ++seed) {
      SimWorld world(n + 1);
      const Group group = reversed_group(n);
      auto comms = communicators(world, group);
      constexpr int kOps = 3;
      constexpr std::int64_t kBlock = 5;
      std::vector<std::vector<Tensor>> f32_out(n), i64_out(n), bf16_out(n);
      run_members(n, seed, [&](int m, std::mt19937& rng) {
        Fired fired;
        for (int op = 0; op < kOps; ++op) {
          Tensor send = filled_f32(kBlock, [&](std::int64_t k) { return 1000.0f * op + 10.0f * m + k; });
          f32_out[m].push_back(Tensor::empty({n * kBlock}, DType::f32));
          comms[m]->all_gather(send, f32_out[m].back(), "f32", fired.tick());
          jitter(rng);
          Tensor send_i =
              filled_i64(kBlock, [&](std::int64_t k) { return (std::int64_t{1} << 40) * op + 100 * m + k; });
          i64_out[m].push_back(Tensor::empty({n * kBlock}, DType::i64));
          comms[m]->all_gather(send_i, i64_out[m].back(), "i64", fired.tick());
          Tensor send_b = filled_f32(kBlock, [&](std::int64_t k) { return 0.5f * m + k; }).to(DType::bf16);
          bf16_out[m].push_back(Tensor::empty({n * kBlock}, DType::bf16));
          comms[m]->all_gather(send_b, bf16_out[m].back(), "bf16", fired.tick());
        }
        fired.wait_for(3 * kOps);
      });
      for (int m = 0; m < n; ++m) {
        for (int op = 0; op < kOps; ++op) {
          for (int j = 0; j < n; ++j) {
            for (std::int64_t k = 0; k < kBlock; ++k) {
              const std::int64_t at = j * kBlock + k;
              REQUIRE(f32_out[m][op].data<float>()[at] == 1000.0f * op + 10.0f * j + k);
              REQUIRE(i64_out[m][op].data<std::int64_t>()[at] == (std::int64_t{1} << 40) * op + 100 * j + k);
              REQUIRE(to_float(bf16_out[m][op].data<bf16>()[at]) == 0.5f * j + k);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sim comm: in-place all_gather (send is a slice of recv)", "[comm][sim]") {
  const int n = 3;
  SimWorld world(n);
  const Group group = reversed_group(n);
  auto comms = communicators(world, group);
  std::vector<Tensor> full(n);
  run_members(n, 7, [&](int m, std::mt19937&) {
    Fired fired;
    full[m] = Tensor::zeros({n * 2, 2});
    Tensor mine = full[m].slice_rows(2 * m, 2 * m + 2);
    mine.fill(static_cast<float>(m + 1));
    comms[m]->all_gather(mine, full[m], "inplace", fired.tick());
    fired.wait_for(1);
  });
  for (int m = 0; m < n; ++m) {
    for (std::int64_t k = 0; k < n * 4; ++k) REQUIRE(full[m].data<float>()[k] == static_cast<float>(k / 4 + 1));
  }
}

TEST_CASE("sim comm: reduce_scatter and all_reduce sum over members for 1-4 ranks", "[comm][sim]") {
  for (int n = 1; n <= 4; ++n) {
    for (std::uint32_t seed = 0; seed < 3; ++seed) {
      SimWorld world(n + 1);
      const Group group = reversed_group(n);
      auto comms = communicators(world, group);
      constexpr std::int64_t kBlock = 4;
      std::vector<Tensor> scattered(n), reduced(n);
      run_members(n, seed, [&](int m, std::mt19937& rng) {
        Fired fired;
        // Integer values: every summation order gives the same exact result here.
        Tensor send = filled_f32(n * kBlock, [&](std::int64_t k) { return static_cast<float>((m + 1) * 100 + k); });
        scattered[m] = Tensor::empty({kBlock}, DType::f32);
        comms[m]->reduce_scatter(send, scattered[m], "grads", fired.tick());
        jitter(rng);
        reduced[m] = filled_f32(6, [&](std::int64_t k) { return static_cast<float>(m * 10 + k); });
        comms[m]->all_reduce(reduced[m], "loss", fired.tick());
        fired.wait_for(2);
      });
      const float member_sum = static_cast<float>(n * (n + 1) / 2);  // sum of (m + 1)
      for (int m = 0; m < n; ++m) {
        for (std::int64_t k = 0; k < kBlock; ++k) {
          REQUIRE(scattered[m].data<float>()[k] == 100.0f * member_sum + static_cast<float>(n * (m * kBlock + k)));
        }
        for (std::int64_t k = 0; k < 6; ++k) {
          REQUIRE(reduced[m].data<float>()[k] == static_cast<float>(10 * n * (n - 1) / 2 + n * k));
        }
      }
    }
  }
}

TEST_CASE("sim comm: broadcast copies the root's tensor for 1-4 ranks and every root", "[comm][sim]") {
  for (int n = 1; n <= 4; ++n) {
    SimWorld world(n + 1);
    const Group group = reversed_group(n);
    auto comms = communicators(world, group);
    std::vector<std::vector<Tensor>> f32_io(n), bf16_io(n);
    run_members(n, static_cast<std::uint32_t>(n), [&](int m, std::mt19937& rng) {
      Fired fired;
      for (int root = 0; root < n; ++root) {
        f32_io[m].push_back(filled_f32(3, [&](std::int64_t k) { return 10.0f * m + k; }));
        comms[m]->broadcast(f32_io[m].back(), root, "f32", fired.tick());
        jitter(rng);
        bf16_io[m].push_back(filled_f32(3, [&](std::int64_t k) { return -1.0f * m - 0.25f * k; }).to(DType::bf16));
        comms[m]->broadcast(bf16_io[m].back(), root, "bf16", fired.tick());
      }
      fired.wait_for(2 * n);
    });
    for (int m = 0; m < n; ++m) {
      for (int root = 0; root < n; ++root) {
        for (std::int64_t k = 0; k < 3; ++k) {
          REQUIRE(f32_io[m][root].data<float>()[k] == 10.0f * root + k);
          REQUIRE(to_float(bf16_io[m][root].data<bf16>()[k]) == -1.0f * root - 0.25f * k);
        }
      }
    }
  }
}

TEST_CASE("sim comm: all_to_all_v routes uneven blocks for 1-4 ranks", "[comm][sim]") {
  // Member i sends (i + 2j) % 3 elements to member j; element k of that block is i*100 + j*10 + k.
  auto count = [](int from, int to) { return static_cast<std::int64_t>((from + 2 * to) % 3); };
  for (int n = 1; n <= 4; ++n) {
    for (std::uint32_t seed = 0; seed < 3; ++seed) {
      SimWorld world(n + 1);
      const Group group = reversed_group(n);
      auto comms = communicators(world, group);
      std::vector<Tensor> received(n);
      std::vector<std::vector<std::int64_t>> recv_counts(n);
      run_members(n, seed, [&](int m, std::mt19937& rng) {
        Fired fired;
        std::vector<std::int64_t> send_counts(n), values;
        for (int j = 0; j < n; ++j) {
          send_counts[j] = count(m, j);
          recv_counts[m].push_back(count(j, m));
          for (std::int64_t k = 0; k < send_counts[j]; ++k) values.push_back(m * 100 + j * 10 + k);
        }
        Tensor send = filled_i64(static_cast<std::int64_t>(values.size()), [&](std::int64_t k) { return values[k]; });
        const std::int64_t total = std::accumulate(recv_counts[m].begin(), recv_counts[m].end(), std::int64_t{0});
        received[m] = Tensor::empty({total}, DType::i64);
        jitter(rng);
        comms[m]->all_to_all_v(send, send_counts, received[m], recv_counts[m], "dispatch", fired.tick());
        fired.wait_for(1);
      });
      for (int m = 0; m < n; ++m) {
        std::vector<std::int64_t> expected;
        for (int j = 0; j < n; ++j) {
          for (std::int64_t k = 0; k < count(j, m); ++k) expected.push_back(j * 100 + m * 10 + k);
        }
        const auto got = received[m].span<std::int64_t>();
        REQUIRE(std::vector<std::int64_t>(got.begin(), got.end()) == expected);
      }
    }
  }
}

TEST_CASE("sim comm: send/recv pair in FIFO order per (sender, receiver) for 2-4 ranks", "[comm][sim]") {
  constexpr int kMessages = 3;
  for (int n = 2; n <= 4; ++n) {  // a peer is another member (one member alone has none)
    for (std::uint32_t seed = 0; seed < 3; ++seed) {
      SimWorld world(n + 1);
      const Group group = reversed_group(n, "pp");
      auto comms = communicators(world, group);
      std::vector<std::vector<Tensor>> inbox(n);
      run_members(n, seed, [&](int m, std::mt19937& rng) {
        Fired fired;
        const int next = (m + 1) % n, previous = (m + n - 1) % n;
        for (int k = 0; k < kMessages; ++k) inbox[m].push_back(Tensor::empty({2}, DType::f32));
        // Half the members post their receives first, so both pairing directions happen.
        auto post_sends = [&] {
          for (int k = 0; k < kMessages; ++k) {
            comms[m]->send(filled_f32(2, [&](std::int64_t e) { return 100.0f * m + 10.0f * k + e; }), next, "act",
                           fired.tick());
            jitter(rng);
          }
        };
        auto post_recvs = [&] {
          for (int k = 0; k < kMessages; ++k) {
            comms[m]->recv(inbox[m][k], previous, "act", fired.tick());
            jitter(rng);
          }
        };
        if ((m + seed) % 2) {
          post_recvs();
          post_sends();
        } else {
          post_sends();
          post_recvs();
        }
        fired.wait_for(2 * kMessages);
      });
      for (int m = 0; m < n; ++m) {
        const int previous = (m + n - 1) % n;
        for (int k = 0; k < kMessages; ++k) {
          for (std::int64_t e = 0; e < 2; ++e) {
            REQUIRE(inbox[m][k].data<float>()[e] == 100.0f * previous + 10.0f * k + e);
          }
        }
      }
    }
  }
}

TEST_CASE("sim comm: reductions are bitwise independent of posting order and follow the pairwise tree",
          "[comm][sim]") {
  constexpr std::int64_t kElements = 64;
  for (int n : {2, 3, 4, 5}) {
    // Values over many magnitudes and both signs, so association changes the rounding.
    std::mt19937 rng(1234u + static_cast<std::uint32_t>(n));
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> inputs(n, std::vector<float>(static_cast<std::size_t>(n * kElements)));
    for (auto& v : inputs) {
      for (float& x : v) x = std::ldexp(normal(rng), static_cast<int>(rng() % 40) - 20);
    }
    // expected[k] = explicit tree over members of inputs[m][k]
    std::vector<float> expected(static_cast<std::size_t>(n * kElements));
    bool tree_differs_from_sequential = false;
    for (std::size_t k = 0; k < expected.size(); ++k) {
      std::vector<float> column;
      for (int m = 0; m < n; ++m) column.push_back(inputs[m][k]);
      expected[k] = explicit_tree(column, 0, column.size());
      float sequential = 0;
      for (float x : column) sequential += x;
      if (sequential != expected[k]) tree_differs_from_sequential = true;
    }
    if (n == 4 || n == 5) REQUIRE(tree_differs_from_sequential);  // the data tells orders apart

    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    do {
      SimWorld world(n);
      const Group group = reversed_group(n);
      auto comms = communicators(world, group);
      Fired fired;
      std::vector<Tensor> reduced(n), scattered(n), sends(n);
      for (int m = 0; m < n; ++m) {
        reduced[m] = Tensor::from_floats({n * kElements}, inputs[m]);
        sends[m] = Tensor::from_floats({n * kElements}, inputs[m]);
        scattered[m] = Tensor::empty({kElements}, DType::f32);
      }
      // One thread posts for every member, in this permutation's order (posting never blocks).
      for (int m : order) comms[m]->all_reduce(reduced[m], "ar", fired.tick());
      for (int m : order) comms[m]->reduce_scatter(sends[m], scattered[m], "rs", fired.tick());
      REQUIRE(fired.wait_for(2 * n));
      const Tensor expected_tensor = Tensor::from_floats({n * kElements}, expected);
      for (int m = 0; m < n; ++m) {
        REQUIRE(same_bits(reduced[m], expected_tensor));
        REQUIRE(same_bits(scattered[m], expected_tensor.slice_rows(m * kElements, (m + 1) * kElements)));
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

TEST_CASE("sim comm: threaded reductions are bitwise reproducible across runs", "[comm][sim]") {
  const int n = 4;
  std::vector<float> input(n * 32);
  std::mt19937 rng(99);
  std::normal_distribution<float> normal;
  for (float& x : input) x = std::ldexp(normal(rng), static_cast<int>(rng() % 30) - 15);
  Tensor first;
  for (std::uint32_t run = 0; run < 8; ++run) {
    SimWorld world(n);
    auto comms = communicators(world, reversed_group(n));
    std::vector<Tensor> io(n);
    run_members(n, run, [&](int m, std::mt19937&) {
      Fired fired;
      std::vector<float> mine(input.size());
      for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = input[k] * static_cast<float>(m + 1) - 0.1f * m;
      io[m] = Tensor::from_floats({static_cast<std::int64_t>(mine.size())}, mine);
      comms[m]->all_reduce(io[m], "ar", fired.tick());
      fired.wait_for(1);
    });
    for (int m = 1; m < n; ++m) REQUIRE(same_bits(io[m], io[0]));
    if (run == 0) first = io[0];
    REQUIRE(same_bits(io[0], first));
  }
}

TEST_CASE("sim comm: mismatched collectives are detected with a clear message", "[comm][sim]") {
  Fired fired;  // outlives the world: completions of abandoned ops never fire
  SimWorld world(3);
  const Group group{"dp_shard", {2, 0}};
  auto a = world.communicator(group, 2);  // member 0
  auto b = world.communicator(group, 0);  // member 1

  auto message_of = [](const std::function<void()>& post) {
    try {
      post();
    } catch (const std::logic_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };

  SECTION("kinds differ") {
    Tensor x = Tensor::full({4}, 1.0f);
    a->all_reduce(x, "unit.a", fired.tick());
    const std::string what = message_of([&] {
      b->all_gather(Tensor::full({4}, 1.0f), Tensor::empty({8}, DType::f32), "unit.b", fired.tick());
    });
    CHECK(what.find("dp_shard[2,0]") != std::string::npos);
    CHECK(what.find("op #0") != std::string::npos);
    CHECK(what.find("all_reduce") != std::string::npos);
    CHECK(what.find("all_gather") != std::string::npos);
    CHECK(what.find("unit.a") != std::string::npos);
    CHECK(what.find("unit.b") != std::string::npos);
    // The offending post was not registered: the right one still completes op #0.
    Tensor y = Tensor::full({4}, 2.0f);
    b->all_reduce(y, "unit.b", fired.tick());
    REQUIRE(fired.wait_for(2));
    CHECK(x.data<float>()[0] == 3.0f);
    CHECK(y.data<float>()[3] == 3.0f);
  }
  SECTION("dtypes differ") {
    a->all_gather(Tensor::full({2}, 1.0f), Tensor::empty({4}, DType::f32), "g", fired.tick());
    Tensor half = Tensor::full({2}, 1.0f).to(DType::bf16);
    const std::string what =
        message_of([&] { b->all_gather(half, Tensor::empty({4}, DType::bf16), "g", fired.tick()); });
    CHECK(what.find("dtypes differ") != std::string::npos);
    CHECK(what.find("op #0") != std::string::npos);
    CHECK(fired.count() == 0);
  }
  SECTION("sizes differ") {
    Fired done_first;
    a->all_reduce(Tensor::full({3}, 1.0f), "first", done_first.tick());
    b->all_reduce(Tensor::full({3}, 1.0f), "first", done_first.tick());
    REQUIRE(done_first.wait_for(2));
    a->all_reduce(Tensor::full({4}, 1.0f), "x", fired.tick());
    const std::string what = message_of([&] { b->all_reduce(Tensor::full({5}, 1.0f), "x", fired.tick()); });
    CHECK(what.find("sizes differ") != std::string::npos);
    CHECK(what.find("op #1") != std::string::npos);
    CHECK_THROWS_AS(b->broadcast(Tensor::full({4}, 1.0f), 0, "x", fired.tick()), std::logic_error);
  }
  SECTION("broadcast roots differ") {
    a->broadcast(Tensor::full({2}, 1.0f), 0, "bc", fired.tick());
    const std::string what = message_of([&] { b->broadcast(Tensor::full({2}, 1.0f), 1, "bc", fired.tick()); });
    CHECK(what.find("roots differ") != std::string::npos);
  }
  SECTION("all_to_all_v counts disagree") {
    // member 0 sends 2 to member 1, but member 1 expects 1 from member 0
    a->all_to_all_v(Tensor::zeros({3}), {1, 2}, Tensor::zeros({3}), {1, 2}, "a2a", fired.tick());
    const std::string what = message_of([&] {
      b->all_to_all_v(Tensor::zeros({3}), {2, 1}, Tensor::zeros({2}), {1, 1}, "a2a", fired.tick());
    });
    CHECK(what.find("counts disagree") != std::string::npos);
  }
  SECTION("send and recv sizes differ") {
    a->send(Tensor::full({4}, 1.0f), 1, "p2p", fired.tick());
    const std::string what = message_of([&] { b->recv(Tensor::empty({2}, DType::f32), 0, "p2p", fired.tick()); });
    CHECK(what.find("sizes differ") != std::string::npos);
    CHECK(what.find("message #0 from member 0 to member 1") != std::string::npos);
  }
  SECTION("local misuse is an invalid argument") {
    CHECK_THROWS_AS(a->all_reduce(Tensor::zeros({2}, DType::bf16), "x", fired.tick()), std::invalid_argument);
    CHECK_THROWS_AS(a->reduce_scatter(Tensor::zeros({4}, DType::i64), Tensor::zeros({2}, DType::i64), "x",
                                      fired.tick()),
                    std::invalid_argument);
    CHECK_THROWS_AS(a->all_gather(Tensor::zeros({2}), Tensor::zeros({3}), "x", fired.tick()), std::invalid_argument);
    CHECK_THROWS_AS(a->reduce_scatter(Tensor::zeros({4}), Tensor::zeros({3}), "x", fired.tick()),
                    std::invalid_argument);
    CHECK_THROWS_AS(a->broadcast(Tensor::zeros({2}), 2, "x", fired.tick()), std::invalid_argument);
    CHECK_THROWS_AS(a->send(Tensor::zeros({2}), -1, "x", fired.tick()), std::invalid_argument);
    CHECK_THROWS_AS(a->all_to_all_v(Tensor::zeros({3}), {1, 1}, Tensor::zeros({2}), {1, 1}, "x", fired.tick()),
                    std::invalid_argument);
    CHECK_THROWS_AS(a->all_to_all_v(Tensor::zeros({2}), {1, 1}, Tensor::zeros({3}), {2, 1}, "x", fired.tick()),
                    std::invalid_argument);  // self block: sends 1 to itself, expects 2
    CHECK(fired.count() == 0);
  }
}

TEST_CASE("sim comm: without delays a completing post fires synchronously", "[comm][sim]") {
  SimWorld world(2);
  auto solo = world.communicator(Group{"world", {1}}, 1);
  bool done = false;
  Tensor x = Tensor::full({2}, 4.0f);
  solo->all_reduce(x, "solo", [&] { done = true; });
  CHECK(done);  // one member: the post itself completes the op
  CHECK(x.data<float>()[1] == 4.0f);
}

TEST_CASE("sim comm: a delayed collective completes on the timer thread, after posting returned, in issue order",
          "[comm][sim]") {
  constexpr auto kDelay = 1000ms;
  SimOptions options;
  options.delay[CollectiveKind::all_reduce] = kDelay;
  SimWorld world(2, options);
  const Group group{"dp_shard", {0, 1}};
  auto a = world.communicator(group, 0);
  auto b = world.communicator(group, 1);

  std::atomic<bool> posted{false};
  std::mutex mutex;
  std::vector<bool> posted_seen;
  std::vector<std::thread::id> fired_on;
  std::vector<std::string> order;  // per completion: which op, in firing order
  Fired fired;
  auto note = [&](const std::string& what) {
    return [&, what] {
      std::lock_guard lock(mutex);
      posted_seen.push_back(posted.load());
      fired_on.push_back(std::this_thread::get_id());
      order.push_back(what);
    };
  };
  auto counted = [&](Completion c) {
    return [&, c] {
      c();
      fired.tick()();
    };
  };

  Tensor x = Tensor::full({3}, 1.0f), y = Tensor::full({3}, 2.0f);
  Tensor gx = Tensor::full({1}, 5.0f), gy = Tensor::full({1}, 6.0f);
  Tensor gathered_x = Tensor::empty({2}, DType::f32), gathered_y = Tensor::empty({2}, DType::f32);
  a->all_reduce(x, "ar", counted(note("ar")));
  b->all_reduce(y, "ar", counted(note("ar")));
  // An all_gather (no delay of its own) issued after the delayed all_reduce.
  a->all_gather(gx, gathered_x, "ag", counted(note("ag")));
  b->all_gather(gy, gathered_y, "ag", counted(note("ag")));
  posted = true;  // set after the posts returned
  REQUIRE(fired.wait_for(4));

  std::lock_guard lock(mutex);
  REQUIRE(order.size() == 4);
  for (std::size_t i = 0; i < order.size(); ++i) {
    CHECK(posted_seen[i]);                                   // the posts returned before any completion
    CHECK(fired_on[i] != std::this_thread::get_id());        // completions run on the timer thread
  }
  for (std::size_t i = 0; i < 2; ++i) CHECK(order[i] == "ar");
  // Per member, completions keep issue order: the undelayed all_gather waits for the all_reduce.
  CHECK(order[2] == "ag");
  CHECK(order[3] == "ag");
  CHECK(x.data<float>()[0] == 3.0f);
  CHECK(y.data<float>()[2] == 3.0f);
  CHECK(gathered_x.data<float>()[1] == 6.0f);
  CHECK(gathered_y.data<float>()[0] == 5.0f);

  // Event order from the record (not durations: machines are noisy): each member's all_reduce
  // ends before its all_gather ends.
  std::map<int, std::vector<CollectiveKind>> ended;
  for (const CollectiveRecord& r : world.recorder()->records()) ended[r.rank].push_back(r.kind);
  REQUIRE(ended.size() == 2);
  for (const auto& [rank, kinds] : ended) {
    CHECK(kinds == std::vector<CollectiveKind>{CollectiveKind::all_reduce, CollectiveKind::all_gather});
  }
}

TEST_CASE("sim comm: a delayed recv posted first completes after its send, with the data", "[comm][sim]") {
  constexpr auto kDelay = 40ms;
  SimOptions options;
  options.delay[CollectiveKind::recv] = kDelay;
  SimWorld world(2, options);
  const Group group{"pp", {0, 1}};
  auto a = world.communicator(group, 0);
  auto b = world.communicator(group, 1);
  Fired fired;
  std::atomic<bool> recv_fired{false};
  Tensor inbox = Tensor::empty({2}, DType::f32);
  b->recv(inbox, 0, "act", [&] {
    recv_fired = true;
    fired.tick()();
  });
  a->send(Tensor::full({2}, 7.0f), 1, "act", fired.tick());
  REQUIRE(fired.wait_for(2));
  CHECK(recv_fired);
  CHECK(inbox.data<float>()[1] == 7.0f);
  // Event order from the record: the recv ends after the send was posted.
  double send_posted = -1, recv_ended = -1;
  for (const CollectiveRecord& r : world.recorder()->records()) {
    if (r.kind == CollectiveKind::send) send_posted = r.start_us;
    if (r.kind == CollectiveKind::recv) recv_ended = r.end_us;
  }
  REQUIRE(send_posted >= 0);
  CHECK(recv_ended >= send_posted);
}

TEST_CASE("collective records: a tap gets its ranks' records until taken, and without history none are kept",
          "[comm][sim]") {
  auto recorder = CollectiveRecorder::without_history();
  SimWorld world(4, {}, recorder);
  auto mine = recorder->tap({2, 0});
  auto dropped = recorder->tap({1});
  dropped.reset();  // a dropped tap is skipped (and pruned)
  const Group group{"dp", {0, 1, 2, 3}};
  auto comms = communicators(world, group);
  auto round = [&](const std::string& tag) {
    run_members(4, 3, [&](int m, std::mt19937&) {
      Fired fired;
      Tensor io = Tensor::full({2}, 1.0f);
      comms[m]->all_reduce(io, tag, fired.tick());
      fired.wait_for(1);
    });
  };
  round("first");
  auto taken = mine->take();
  REQUIRE(taken.size() == 2);
  std::vector<int> ranks;
  for (const auto& r : taken) {
    ranks.push_back(r.rank);
    CHECK(r.tag == "first");
  }
  std::sort(ranks.begin(), ranks.end());
  CHECK(ranks == std::vector<int>{0, 2});
  CHECK(mine->take().empty());  // taken once
  round("second");
  taken = mine->take();
  REQUIRE(taken.size() == 2);
  CHECK(taken[0].tag == "second");
  CHECK(taken[1].tag == "second");
  CHECK(recorder->records().empty());  // no history kept
}

TEST_CASE("sim comm: one record per rank per collective", "[comm][sim]") {
  auto recorder = std::make_shared<CollectiveRecorder>();
  recorder->set_step(7);
  SimWorld world(4, {}, recorder);
  CHECK(world.recorder() == recorder);
  const Group group{"ep", {3, 1, 2}};
  auto comms = communicators(world, group);
  const int n = 3;
  run_members(n, 5, [&](int m, std::mt19937& rng) {
    Fired fired;
    comms[m]->all_gather(Tensor::full({4}, 1.0f), Tensor::empty({12}, DType::f32), "unit.0", fired.tick());
    jitter(rng);
    comms[m]->broadcast(Tensor::zeros({5}, DType::bf16), 1, "bcast", fired.tick());
    Tensor io = Tensor::full({6}, 1.0f);
    comms[m]->all_reduce(io, "loss", fired.tick());
    std::vector<std::int64_t> counts(n, 1);
    comms[m]->all_to_all_v(Tensor::zeros({3}, DType::i32), counts, Tensor::zeros({3}, DType::i32), counts, "moe",
                           fired.tick());
    const int next = (m + 1) % n, previous = (m + n - 1) % n;
    comms[m]->send(Tensor::zeros({2}, DType::i64), next, "p2p", fired.tick());
    comms[m]->recv(Tensor::zeros({2}, DType::i64), previous, "p2p", fired.tick());
    fired.wait_for(6);
  });

  const auto records = recorder->records();
  REQUIRE(records.size() == 6 * n);
  struct Expect {
    std::string tag;
    CollectiveKind kind;
    DType dtype;
  };
  for (const Expect& e : {Expect{"unit.0", CollectiveKind::all_gather, DType::f32},
                          Expect{"bcast", CollectiveKind::broadcast, DType::bf16},
                          Expect{"loss", CollectiveKind::all_reduce, DType::f32},
                          Expect{"moe", CollectiveKind::all_to_all_v, DType::i32}}) {
    std::vector<int> ranks;
    for (const CollectiveRecord& r : records) {
      if (r.tag != e.tag) continue;
      ranks.push_back(r.rank);
      CHECK(r.kind == e.kind);
      CHECK(r.dtype == e.dtype);
      CHECK(r.group == "ep[3,1,2]");
      CHECK(r.axis == "ep");
      CHECK(r.step == 7);
      CHECK(r.end_us >= r.start_us);
      CHECK(r.start_us >= 0.0);
      std::int64_t bytes = 0;
      if (e.kind == CollectiveKind::all_gather) bytes = 16;
      if (e.kind == CollectiveKind::broadcast) bytes = r.rank == group.ranks[1] ? 10 : 0;  // root is member 1
      if (e.kind == CollectiveKind::all_reduce) bytes = 24;
      if (e.kind == CollectiveKind::all_to_all_v) bytes = 12;
      CHECK(r.bytes == bytes);
    }
    std::sort(ranks.begin(), ranks.end());
    CHECK(ranks == std::vector<int>{1, 2, 3});
  }
  int sends = 0, recvs = 0;
  for (const CollectiveRecord& r : records) {
    if (r.kind == CollectiveKind::send) {
      ++sends;
      CHECK(r.bytes == 16);
      CHECK(r.dtype == DType::i64);
    }
    if (r.kind == CollectiveKind::recv) {
      ++recvs;
      CHECK(r.bytes == 0);
    }
  }
  CHECK(sends == n);
  CHECK(recvs == n);
}

namespace {

// Each member posts all_reduce #0 from its own thread; every later one is posted by the member's
// previous completion. Member m contributes op + m, so op's sum is n*op + n(n-1)/2.
void run_chain(SimWorld& world, int n, int ops) {
  const Group group = reversed_group(n);
  auto comms = communicators(world, group);
  struct Member {
    Tensor io = Tensor::empty({1}, DType::f32);
    std::vector<float> results;
    int posted = 0;
  };
  std::vector<Member> members(n);
  Fired finished;
  std::function<void(int)> post = [&](int m) {
    Member& me = members[m];
    me.io.fill(static_cast<float>(me.posted + m));
    ++me.posted;
    comms[m]->all_reduce(me.io, "chain", [&, m] {
      Member& self = members[m];
      self.results.push_back(self.io.data<float>()[0]);
      if (self.posted < ops) post(m);
      else finished.tick()();
    });
  };
  run_members(n, 11, [&](int m, std::mt19937&) { post(m); });
  REQUIRE(finished.wait_for(n));
  for (int m = 0; m < n; ++m) {
    REQUIRE(members[m].results.size() == static_cast<std::size_t>(ops));
    for (int op = 0; op < ops; ++op) {
      REQUIRE(members[m].results[op] == static_cast<float>(n * op + n * (n - 1) / 2));
    }
  }
  const auto records = world.recorder()->records();
  CHECK(records.size() == static_cast<std::size_t>(n * ops));
}

}  // namespace

TEST_CASE("sim comm: 200 all_reduces chained from completions finish in order", "[comm][sim]") {
  for (int n : {1, 2, 3, 4}) {
    SimWorld world(n);
    run_chain(world, n, 200);
  }
}

TEST_CASE("sim comm: a single-member chain does not grow the stack", "[comm][sim]") {
  SimWorld world(1);
  run_chain(world, 1, 100000);
}

TEST_CASE("sim comm: chained all_reduces with an injected delay", "[comm][sim]") {
  SimOptions options;
  options.delay[CollectiveKind::all_reduce] = 50us;
  SimWorld world(3, options);
  run_chain(world, 3, 200);
}

TEST_CASE("sim comm: destroying the world fires queued delayed completions", "[comm][sim]") {
  std::atomic<int> fired{0};
  Tensor x = Tensor::full({1}, 1.0f);
  {
    // An hour: only the world's end can fire them within the test's time (a short delay could
    // expire on a slow machine and fire them the ordinary way; a destructor that waited out the
    // delay would hang, not pass).
    SimOptions options;
    options.delay[CollectiveKind::all_reduce] = std::chrono::hours(1);
    SimWorld world(1, options);
    auto solo = world.communicator(Group{"world", {0}}, 0);
    solo->all_reduce(x, "late", [&] { ++fired; });
    solo->all_reduce(x, "later", [&] { ++fired; });
  }
  CHECK(fired == 2);
}
