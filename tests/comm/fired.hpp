// Completion counting for the comm tests.
#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "comm/communicator.hpp"

namespace atl::testing {

// Counts fired completions; waits with a generous deadlock watchdog (never a timing claim).
class Fired {
 public:
  Completion tick() {
    return [this] {
      std::lock_guard lock(mutex_);
      ++count_;
      changed_.notify_all();
    };
  }
  bool wait_for(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(120), [&] { return count_ >= n; });
  }
  int count() {
    std::lock_guard lock(mutex_);
    return count_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

}  // namespace atl::testing
