// Which remote ranks' ends a UCX world expects, and what each kind of end changes (ucx_world.cpp).
// A peer that said goodbye has finished the job: nothing more is owed to it, and its endpoint
// breaking is its end, not a failure. A peer whose end is only expected (this process is ending
// the job: every other node may end from now on) may break without a report too, but what this
// process sent it is still flushed before the endpoints close: a completed send only means its
// buffer may be reused, and that peer may still be waiting for the message.
#pragma once
#include <mutex>
#include <set>
#include <vector>

namespace atl {

class PeerEnds {
 public:
  static constexpr int kNoPeer = -1;  // a failure bound to no one peer (a receive, the progress thread)

  void said_goodbye(const std::vector<int>& ranks) {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.insert(ranks.begin(), ranks.end());
  }
  void end_expected(const std::vector<int>& ranks) {
    std::lock_guard<std::mutex> lock(mutex_);
    expected_.insert(ranks.begin(), ranks.end());
  }
  // A failure of a transfer with `peer` is that peer's end, not news.
  bool explains(int peer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return explained(peer);
  }
  // Before closing, this process flushes its endpoint to `peer`.
  bool owed_flush(int peer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !finished_.count(peer);
  }
  // Notes a failed transfer with `peer` (kNoPeer: none); true for the world's first.
  bool note_failure(int peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool first = failed_.empty();
    failed_.insert(peer);
    return first;
  }
  // A failure is noted that no end explains (an end can be announced after its failure shows).
  bool failure_unexplained() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int peer : failed_) {
      if (!explained(peer)) return true;
    }
    return false;
  }

 private:
  bool explained(int peer) const { return peer != kNoPeer && (finished_.count(peer) || expected_.count(peer)); }

  mutable std::mutex mutex_;
  std::set<int> finished_, expected_, failed_;
};

}  // namespace atl
