#include "actors/trace.hpp"

#include <map>

#include <nlohmann/json.hpp>

namespace atl {

void SpanTracer::set_step(std::int64_t step) {
  std::lock_guard lock(mutex_);
  step_ = step;
}

void SpanTracer::add(Span span) {
  if (!recording_) return;
  std::lock_guard lock(mutex_);
  span.step = step_;
  spans_.push_back(std::move(span));
}

std::vector<Span> SpanTracer::spans() const {
  std::lock_guard lock(mutex_);
  return spans_;
}

std::string SpanTracer::chrome_trace_json() const {
  const std::vector<Span> all = spans();
  nlohmann::json events = nlohmann::json::array();
  std::map<std::pair<int, std::string>, int> thread_ids;  // (rank, actor) -> tid
  for (const Span& s : all) {
    auto key = std::make_pair(s.rank, s.actor);
    if (!thread_ids.count(key)) {
      const int tid = static_cast<int>(thread_ids.size()) + 1;
      thread_ids[key] = tid;
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", s.rank}, {"tid", tid},
                        {"args", {{"name", s.actor}}}});
    }
  }
  std::map<int, bool> ranks;
  for (const Span& s : all) ranks[s.rank] = true;
  for (const auto& [rank, unused] : ranks) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  }
  for (const Span& s : all) {
    events.push_back({{"ph", "X"},
                      {"name", s.name},
                      {"cat", s.category},
                      {"pid", s.rank},
                      {"tid", thread_ids[{s.rank, s.actor}]},
                      {"ts", s.start_us},
                      {"dur", s.end_us - s.start_us},
                      {"args", {{"step", s.step}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace atl
