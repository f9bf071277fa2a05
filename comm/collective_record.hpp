// One record per rank per finished collective, for traces and tests. A CollectiveRecorder is
// shared by every communicator of a job (and by other tracing, through its epoch) and is safe to
// use from any thread. It keeps every record (records()) only when made to: a long run appends
// hundreds per step. Consumers that only need the records as they come (an engine's per-step
// traffic) take them from a tap.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/dtype.hpp"
#include "kernels/rank_group.hpp"

namespace atl {

struct CollectiveRecord {
  CollectiveKind kind = CollectiveKind::all_reduce;
  std::string group;  // Group::describe(), e.g. "dp_shard[0,1]"
  std::string axis;
  DType dtype = DType::f32;
  // This rank's send bytes: the send tensor (all_gather, reduce_scatter, all_to_all_v, send), the
  // in-out tensor (all_reduce; broadcast on the root), 0 for broadcast off the root and for recv.
  std::int64_t bytes = 0;
  std::string tag;
  int rank = -1;        // global rank
  double start_us = 0;  // when this rank posted, microseconds since the recorder's epoch
  double end_us = 0;    // when this rank's completion fired
  std::int64_t step = -1;  // the recorder's current step when this rank posted
};

// The records of some ranks, appended since they were last taken.
class CollectiveTap {
 public:
  std::vector<CollectiveRecord> take();

 private:
  friend class CollectiveRecorder;
  explicit CollectiveTap(std::vector<int> ranks) : ranks_(std::move(ranks)) {}
  void offer(const CollectiveRecord& record);
  const std::vector<int> ranks_;  // sorted
  std::mutex mutex_;
  std::vector<CollectiveRecord> records_;
};

class CollectiveRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Pass another tracer's epoch to put both on one time axis. `keep_history`: whether records()
  // holds every record appended (tests, traces), or none.
  explicit CollectiveRecorder(Clock::time_point epoch = Clock::now(), bool keep_history = true)
      : epoch_(epoch), keep_history_(keep_history) {}
  // A recorder that keeps no history (a run: its engine takes each step's records from a tap).
  static std::shared_ptr<CollectiveRecorder> without_history() {
    return std::make_shared<CollectiveRecorder>(Clock::now(), false);
  }

  Clock::time_point epoch() const { return epoch_; }
  double to_us(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - epoch_).count();
  }
  double now_us() const { return to_us(Clock::now()); }

  void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }
  std::int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // A record of a collective this rank posts now (start time and step set), and a completion
  // that stamps its end, appends it, then runs `done`: what every backend wraps its caller's
  // completion in.
  CollectiveRecord posted(CollectiveKind kind, const Group& group, DType dtype, std::int64_t bytes,
                          const std::string& tag, int rank) const;
  static Completion finishing(std::shared_ptr<CollectiveRecorder> recorder, CollectiveRecord record, Completion done);

  void append(CollectiveRecord record);
  std::vector<CollectiveRecord> records() const;  // a snapshot, in append order (empty without history)
  // From now on, every record of these ranks is also offered to the tap, until it is dropped.
  std::shared_ptr<CollectiveTap> tap(std::vector<int> ranks);

 private:
  const Clock::time_point epoch_;
  const bool keep_history_;
  std::atomic<std::int64_t> step_{-1};
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> records_;
  std::vector<std::weak_ptr<CollectiveTap>> taps_;
};

}  // namespace atl
