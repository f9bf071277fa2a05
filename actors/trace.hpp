// Spans of actor work (gather, compute, reduce) per rank and actor, written as a Chrome
// trace-event JSON file (opens in Perfetto / chrome://tracing). Thread-safe; shares its clock
// epoch with the collective record so both line up.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace atl {

struct Span {
  int rank = 0;
  std::string actor;     // e.g. "unit model.layers.0", "compute"
  std::string name;      // e.g. "gather", "forward op 3"
  std::string category;  // gather | compute | reduce
  double start_us = 0, end_us = 0;
  std::int64_t step = -1;
};

class SpanTracer {
 public:
  using Clock = std::chrono::steady_clock;
  // Not `recording`: add() keeps nothing (spans() and the trace are empty).
  SpanTracer(Clock::time_point epoch, bool recording) : epoch_(epoch), recording_(recording) {}
  bool recording() const { return recording_; }
  double now_us() const { return std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count(); }
  void set_step(std::int64_t step);
  void add(Span span);
  std::vector<Span> spans() const;
  // Chrome trace-event JSON: one process per rank, one thread per actor, complete ("X") events.
  std::string chrome_trace_json() const;

 private:
  Clock::time_point epoch_;
  bool recording_;
  mutable std::mutex mutex_;
  std::vector<Span> spans_;
  std::int64_t step_ = -1;
};

}  // namespace atl
