#include "kernels/cpu/compute_pool.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace atl::cpu {

namespace {
thread_local ComputePool* tls_pool = nullptr;
thread_local bool tls_inside_task = false;
}  // namespace

ComputePool::ComputePool(int threads) {
  if (threads < 1) throw std::invalid_argument("compute pool: threads must be >= 1, got " + std::to_string(threads));
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ComputePool::take_tasks(std::unique_lock<std::mutex>& lock) {
  while (next_ < tasks_) {
    const int t = next_++;
    const auto* task = task_;
    lock.unlock();
    std::exception_ptr failure;
    tls_inside_task = true;
    try {
      (*task)(t);
    } catch (...) {
      failure = std::current_exception();
    }
    tls_inside_task = false;
    lock.lock();
    if (failure && !error_) error_ = failure;
    if (--unfinished_ == 0) done_.notify_all();
  }
}

void ComputePool::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::uint64_t seen = generation_;
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    take_tasks(lock);
  }
}

void ComputePool::run(int tasks, const std::function<void(int)>& task) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1 || tls_inside_task) {
    for (int t = 0; t < tasks; ++t) task(t);
    return;
  }
  shared_runs_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(mutex_);
  task_ = &task;
  tasks_ = tasks;
  next_ = 0;
  unfinished_ = tasks;
  error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  take_tasks(lock);
  done_.wait(lock, [&] { return unfinished_ == 0; });
  task_ = nullptr;
  tasks_ = 0;
  std::exception_ptr error = std::exchange(error_, nullptr);
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

ComputePoolScope::ComputePoolScope(ComputePool* pool) : previous_(tls_pool) { tls_pool = pool; }
ComputePoolScope::~ComputePoolScope() { tls_pool = previous_; }

void parallel_ranges(std::int64_t n, int parts, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  parts = static_cast<int>(std::clamp<std::int64_t>(parts, 1, n));
  const std::int64_t base = n / parts, extra = n % parts;
  auto range = [&](int p) {
    const std::int64_t begin = p * base + std::min<std::int64_t>(p, extra);
    body(begin, begin + base + (p < extra ? 1 : 0));
  };
  ComputePool* pool = tls_pool;
  if (parts == 1 || !pool) {
    for (int p = 0; p < parts; ++p) range(p);
  } else {
    pool->run(parts, range);
  }
}

void parallel_for_each(std::int64_t n, const std::function<void(std::int64_t)>& body) {
  if (n > std::numeric_limits<int>::max()) {
    throw std::invalid_argument("parallel_for_each: " + std::to_string(n) + " items; at most 2^31 - 1");
  }
  parallel_ranges(n, static_cast<int>(n), [&](std::int64_t i, std::int64_t) { body(i); });
}

void parallel_for_each_largest_first(const std::vector<std::int64_t>& sizes,
                                     const std::function<void(std::int64_t)>& body) {
  std::vector<std::int64_t> order(sizes.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return sizes[static_cast<std::size_t>(a)] > sizes[static_cast<std::size_t>(b)];
  });
  parallel_for_each(static_cast<std::int64_t>(order.size()),
                    [&](std::int64_t k) { body(order[static_cast<std::size_t>(k)]); });
}

int useful_parts(std::int64_t work, std::int64_t min_work) {
  const ComputePool* pool = tls_pool;
  if (!pool || tls_inside_task) return 1;
  const std::int64_t by_work = std::max<std::int64_t>(1, work / std::max<std::int64_t>(1, min_work));
  return static_cast<int>(std::min<std::int64_t>(pool->threads(), by_work));
}

int default_compute_threads(int ranks_in_process) {
  if (ranks_in_process > 1) return 1;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : static_cast<int>(cores);
}

}  // namespace atl::cpu
