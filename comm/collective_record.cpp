#include "comm/collective_record.hpp"

#include <utility>

namespace atl {

void CollectiveRecorder::append(CollectiveRecord record) {
  std::lock_guard lock(mutex_);
  records_.push_back(std::move(record));
}

std::vector<CollectiveRecord> CollectiveRecorder::records() const {
  std::lock_guard lock(mutex_);
  return records_;
}

std::size_t CollectiveRecorder::size() const {
  std::lock_guard lock(mutex_);
  return records_.size();
}

void CollectiveRecorder::clear() {
  std::lock_guard lock(mutex_);
  records_.clear();
}

}  // namespace atl
