#include "comm/communicator.hpp"

#include <future>

namespace atl {

void run_and_wait(const std::function<void(Completion)>& post) {
  std::promise<void> done;
  post([&done] { done.set_value(); });
  done.get_future().wait();
}

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::all_to_all_v: return "all_to_all_v";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
  }
  return "?";
}

}  // namespace atl
