#include "comm/collective_record.hpp"

#include <algorithm>
#include <utility>

namespace atl {

CollectiveRecord CollectiveRecorder::posted(CollectiveKind kind, const Group& group, DType dtype, std::int64_t bytes,
                                            const std::string& tag, int rank) const {
  CollectiveRecord record;
  record.kind = kind;
  record.group = group.describe();
  record.axis = group.axis;
  record.dtype = dtype;
  record.bytes = bytes;
  record.tag = tag;
  record.rank = rank;
  record.start_us = now_us();
  record.step = step();
  return record;
}

Completion CollectiveRecorder::finishing(std::shared_ptr<CollectiveRecorder> recorder, CollectiveRecord record,
                                         Completion done) {
  return [recorder = std::move(recorder), record = std::move(record), done = std::move(done)]() mutable {
    record.end_us = recorder->now_us();
    recorder->append(std::move(record));
    if (done) done();
  };
}

void CollectiveRecorder::append(CollectiveRecord record) {
  std::lock_guard lock(mutex_);
  std::erase_if(taps_, [&](const std::weak_ptr<CollectiveTap>& weak) {
    const auto tap = weak.lock();
    if (tap) tap->offer(record);
    return !tap;
  });
  if (keep_history_) records_.push_back(std::move(record));
}

std::shared_ptr<CollectiveTap> CollectiveRecorder::tap(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::shared_ptr<CollectiveTap> tap(new CollectiveTap(std::move(ranks)));
  std::lock_guard lock(mutex_);
  taps_.push_back(tap);
  return tap;
}

void CollectiveTap::offer(const CollectiveRecord& record) {
  if (!std::binary_search(ranks_.begin(), ranks_.end(), record.rank)) return;
  std::lock_guard lock(mutex_);
  records_.push_back(record);
}

std::vector<CollectiveRecord> CollectiveTap::take() {
  std::lock_guard lock(mutex_);
  return std::exchange(records_, {});
}

std::vector<CollectiveRecord> CollectiveRecorder::records() const {
  std::lock_guard lock(mutex_);
  return records_;
}


}  // namespace atl
