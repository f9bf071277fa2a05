// The threads one rank's kernels may use (config `compute.threads`). A kernel splits its *outputs*
// over the threads, never a sum, so results are bitwise independent of the thread count.
// A pool is made current for a thread with ComputePoolScope; without one, kernels run on the
// calling thread alone.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace atl::cpu {

class ComputePool {
 public:
  explicit ComputePool(int threads);  // threads >= 1: the caller plus threads - 1 workers
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs task(0) .. task(tasks - 1), the calling thread taking part; returns when all are done and
  // rethrows the first exception a task threw. Calls from inside a task run serially. One pool
  // serves one thread (a rank's compute thread); it is not shared.
  void run(int tasks, const std::function<void(int)>& task);
  // How many run() calls were split into tasks offered to the workers (not run serially): lets a
  // test show that a kernel split its work, so that its thread-invariance check compared
  // something. (Which thread took each task is not counted: the caller may take them all.)
  std::uint64_t shared_runs() const { return shared_runs_.load(std::memory_order_relaxed); }

 private:
  void worker_loop();
  void take_tasks(std::unique_lock<std::mutex>& lock);  // runs tasks until none is left

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int tasks_ = 0, next_ = 0, unfinished_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::atomic<std::uint64_t> shared_runs_{0};
};

class ComputePoolScope {
 public:
  explicit ComputePoolScope(ComputePool* pool);
  ~ComputePoolScope();
  ComputePoolScope(const ComputePoolScope&) = delete;
  ComputePoolScope& operator=(const ComputePoolScope&) = delete;

 private:
  ComputePool* previous_;
};

// Splits [0, n) into `parts` contiguous ranges of near-equal size (the first ones one longer) and
// runs body(begin, end) for each, on the current pool when there is one.
void parallel_ranges(std::int64_t n, int parts, const std::function<void(std::int64_t, std::int64_t)>& body);
// Runs body(i) for each i < n, each as its own task on the current pool when there is one: for
// items of uneven size, such as a model's tensors (a thread that finishes takes the next).
void parallel_for_each(std::int64_t n, const std::function<void(std::int64_t)>& body);
// parallel_for_each over items of the given sizes, the largest handed out first (so that no
// thread starts a big item while the others run out of work); body(i) gets the item's index.
void parallel_for_each_largest_first(const std::vector<std::int64_t>& sizes,
                                     const std::function<void(std::int64_t)>& body);
// How many parts a job of `work` units is worth splitting into on the current pool (at least
// `min_work` units a part; 1 without a pool).
int useful_parts(std::int64_t work, std::int64_t min_work);

// The default compute.threads: every core for a process that runs one rank, one each otherwise.
int default_compute_threads(int ranks_in_process);

}  // namespace atl::cpu
