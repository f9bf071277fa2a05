// The compute pool every kernel splits its outputs over (kernels/cpu/compute_pool.hpp): each task
// runs exactly once whatever the thread count, a task's exception reaches the caller and leaves the
// pool usable, a call from inside a task runs serially, and parallel_ranges and parallel_for_each
// cover their items once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/cpu/compute_pool.hpp"

using namespace atl::cpu;

TEST_CASE("compute pool: every task runs once, for more tasks than threads, call after call", "[pool]") {
  for (int threads : {1, 2, 4}) {
    INFO(threads << " threads");
    ComputePool pool(threads);
    CHECK(pool.threads() == threads);
    for (int tasks : {0, 1, 3, 17, 100}) {
      INFO(tasks << " tasks");
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(tasks));
      pool.run(tasks, [&](int t) { ++runs[static_cast<std::size_t>(t)]; });
      for (const auto& r : runs) CHECK(r.load() == 1);
    }
  }
}

TEST_CASE("compute pool: the first exception a task throws reaches the caller, and the pool runs on", "[pool]") {
  ComputePool pool(3);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(pool.run(8,
                             [&](int t) {
                               ++ran;
                               if (t == 5) throw std::runtime_error("task 5 failed");
                             }),
                    "task 5 failed");
  CHECK(ran.load() == 8);  // the others still ran: the call returns once all are done
  std::atomic<int> after{0};
  pool.run(6, [&](int) { ++after; });
  CHECK(after.load() == 6);
}

TEST_CASE("compute pool: parallel_ranges from inside a task runs serially and still covers its range", "[pool]") {
  ComputePool pool(2);
  ComputePoolScope scope(&pool);
  std::vector<std::atomic<int>> covered(4 * 10);
  pool.run(4, [&](int t) {
    // Nested: on a worker thread there is no current pool; on the calling thread the pool is busy.
    parallel_ranges(10, 3, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) ++covered[static_cast<std::size_t>(t * 10 + i)];
    });
  });
  for (const auto& c : covered) CHECK(c.load() == 1);
}

TEST_CASE("parallel_ranges: near-equal contiguous ranges, the first ones one longer, with or without a pool",
          "[pool]") {
  for (bool with_pool : {false, true}) {
    INFO((with_pool ? "with a pool" : "without a pool"));
    ComputePool pool(2);
    ComputePoolScope scope(with_pool ? &pool : nullptr);
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges(3);
    std::atomic<int> calls{0};
    parallel_ranges(11, 3, [&](std::int64_t begin, std::int64_t end) {
      ranges[static_cast<std::size_t>(calls++)] = {begin, end};
    });
    CHECK(calls.load() == 3);
    std::sort(ranges.begin(), ranges.end());
    CHECK(ranges == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 4}, {4, 8}, {8, 11}});
  }
}

TEST_CASE("parallel_for_each: every item once, one task each on the current pool, serially without one",
          "[pool]") {
  const bool with_pool = GENERATE(false, true);
  const std::int64_t n = GENERATE(0, 1, 2, 57);
  INFO((with_pool ? "with a pool, " : "without a pool, ") << n << " items");
  ComputePool pool(3);
  ComputePoolScope scope(with_pool ? &pool : nullptr);
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
  parallel_for_each(n, [&](std::int64_t i) { ++runs[static_cast<std::size_t>(i)]; });
  for (const auto& r : runs) CHECK(r.load() == 1);
  CHECK(pool.shared_runs() == (with_pool && n > 1 ? 1u : 0u));
}

TEST_CASE("parallel_for_each_largest_first: every item once, handed out largest first (ties in index order)",
          "[pool]") {
  const std::vector<std::int64_t> sizes{3, 10, 1, 10, 7};
  {  // without a pool the hand-out order is the run order
    std::vector<std::int64_t> order;
    parallel_for_each_largest_first(sizes, [&](std::int64_t i) { order.push_back(i); });
    CHECK(order == std::vector<std::int64_t>{1, 3, 4, 0, 2});
  }
  ComputePool pool(3);
  ComputePoolScope scope(&pool);
  std::vector<std::atomic<int>> runs(sizes.size());
  parallel_for_each_largest_first(sizes, [&](std::int64_t i) { ++runs[static_cast<std::size_t>(i)]; });
  for (const auto& r : runs) CHECK(r.load() == 1);
  CHECK(pool.shared_runs() == 1);
}
