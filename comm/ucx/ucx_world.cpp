#include "comm/ucx/ucx_world.hpp"

#include "comm/collective_checks.hpp"
#include "comm/ucx/peer_ends.hpp"

#include "kernels/tree_sum_arrays.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>


namespace atl {

namespace {

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) throw std::runtime_error(std::string("ucx: ") + what + ": " + ucs_status_string(status));
}

// One collective (or send/recv) of one rank: its transfers count down, plus one part for the
// posting itself (released when every transfer is posted and the local copies are done), so a
// transfer that completes at once can never finish the operation before its data is all there.
struct Operation {
  int remaining = 0;
  std::function<void()> finish;
  std::vector<Tensor> keep;  // the buffers in flight stay alive until the operation ends
};

std::uint64_t group_id(const Group& group) {  // FNV-1a of the description, 24 bits
  std::uint64_t h = 1469598103934665603ull;
  for (char c : group.describe()) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return (h ^ (h >> 24) ^ (h >> 48)) & 0xFFFFFFull;
}

// Reductions travel in chunks of this many floats (256 KiB), summed as they arrive while the
// next ones travel; kStagingDepth chunks per member are in flight at once.
constexpr std::int64_t kChunkFloats = 64 * 1024;
constexpr int kStagingDepth = 2;
constexpr std::size_t kMaxFreeSlots = 64;  // the pool keeps at most 16 MiB of idle slots

constexpr std::uint64_t kPointToPoint = 0x800000;  // op numbers of send/recv streams

std::uint64_t make_tag(std::uint64_t group, std::uint64_t op, int source) {
  return (group << 40) | ((op & 0xFFFFFF) << 16) | (static_cast<std::uint64_t>(source) & 0xFFFF);
}

}  // namespace

struct UcxWorld::Impl {
  int world_size = 0;
  std::vector<int> local;
  std::shared_ptr<CollectiveRecorder> recorder;
  // Touched only by the progress thread.
  ucp_context_h context = nullptr;
  std::map<int, ucp_worker_h> workers;
  std::map<std::pair<int, int>, ucp_ep_h> endpoints;  // (local rank, remote rank)
  int in_flight = 0;
  bool closing = false;  // shutdown() is closing the endpoints: nothing more is posted
  bool peer_errors = true;  // endpoints use UCX's peer error handling
  // Staging slots of reductions (kChunkFloats each), reused across operations: a step does not
  // page-fault fresh buffers, and a reused slot is often still in cache when its chunk is summed.
  std::vector<std::unique_ptr<float[]>> free_slots;
  // Every group a communicator was made for, by tag id (communicator(), any thread).
  std::mutex ids_mutex;
  std::map<std::uint64_t, Group> ids;

  std::unique_ptr<float[]> take_slot() {
    if (free_slots.empty()) return std::unique_ptr<float[]>(new float[kChunkFloats]);
    auto slot = std::move(free_slots.back());
    free_slots.pop_back();
    return slot;
  }

  // UCX reports a broken endpoint here (peer error handling) instead of aborting the process. A
  // peer that finished the job first (its UCX closed while this process still saves the last
  // checkpoint) reads just like one that died, unless its end was expected (PeerEnds).
  static void endpoint_failed(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* impl = static_cast<Impl*>(arg);
    int peer = PeerEnds::kNoPeer;
    for (const auto& [key, endpoint] : impl->endpoints) {  // the progress thread's own map
      if (endpoint == ep) peer = key.second;
    }
    impl->transfer_failed("connection", status, peer);
  }
  PeerEnds ends;
  // on_transfer_failure's: what runs when a failure has not ended the process after a while.
  std::chrono::milliseconds stuck_grace{0};
  std::function<void(TransferFailure)> stuck;
  std::atomic<bool> stuck_armed{false};
  // A disagreement (different builds or plans) decides the job's exit code (2: no restart) whatever
  // failed before it, so it is said and remembered even when it is not the first failure.
  std::atomic<bool> disagreement_seen{false};
  std::atomic<bool> ending{false};  // stop() began: failures from here on are the world's own end
  std::weak_ptr<Impl> self;    // for the watchdog thread, which may outlive the world
  std::string message_prefix;  // set_message_prefix's (read on the progress thread)
  std::function<std::string(int)> rank_name = [](int rank) { return "rank " + std::to_string(rank); };
  // The task queue: everything UCX runs on the progress thread.
  std::mutex mutex;
  std::deque<std::function<void()>> tasks;
  bool stopping = false;
  bool sleeping = false;  // in epoll_wait: post() signals task_fd only then
  // Where the thread sleeps: an epoll set of every worker's event fd and task_fd, which post()
  // signals.
  int epoll_fd = -1, task_fd = -1;
  std::thread thread;

  void post(std::function<void()> task) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      tasks.push_back(std::move(task));
      wake = sleeping;  // a thread that is not asleep sees the task before it sleeps
    }
    if (wake) signal();
  }

  // Wakes the thread if it sleeps.
  void signal() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(task_fd, &one, sizeof one);  // EAGAIN: already signalled
  }

  // Runs `task` on the progress thread and waits for it (exceptions travel back).
  template <class R>
  R call(std::function<R()> task) {
    auto promise = std::make_shared<std::promise<R>>();
    auto result = promise->get_future();
    post([task = std::move(task), promise] {
      try {
        if constexpr (std::is_void_v<R>) {
          task();
          promise->set_value();
        } else {
          promise->set_value(task());
        }
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
    return result.get();
  }

  // With nothing to do the thread sleeps until a worker has an event or a task is posted (UCX
  // wakeup: ucp_worker_arm + epoll). While transfers are in flight it first polls kSpinPolls rounds
  // back to back (a message due any moment is seen at once) and sleeps at most kSleepLimitMs.
  // Spinning on, it took a core the compute threads needed while it waited for a busy peer:
  // beam-small at 2 processes x 2 ranks took 1.33x the sim's step over tcp on 2 cores.
  static constexpr int kSpinPolls = 64;
  static constexpr int kSleepLimitMs = 100;  // a safety net while transfers are in flight

  // Adds fd to the epoll set the thread sleeps on.
  void watch(int fd) const {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) throw std::runtime_error("ucx: epoll_ctl failed");
  }

  ~Impl() {
    if (task_fd >= 0) ::close(task_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
  }

  // Sleeps until a worker or task_fd has an event, at most limit_ms (-1: no limit); returns at once
  // when a worker cannot be armed (events pending) or a task is queued.
  void sleep_until_event(int limit_ms) {
    for (auto& [rank, worker] : workers) {
      const ucs_status_t status = ucp_worker_arm(worker);
      if (status == UCS_ERR_BUSY) return;  // events pending: progress first
      if (status != UCS_OK) limit_ms = 1;  // a transport that cannot arm: poll each millisecond, not spin
    }
    {
      std::lock_guard<std::mutex> lock(mutex);  // a task posted after this check signals task_fd
      if (stopping || !tasks.empty()) return;
      sleeping = true;
    }
    epoll_event events[8];
    const int n = ::epoll_wait(epoll_fd, events, 8, limit_ms);
    {
      std::lock_guard<std::mutex> lock(mutex);
      sleeping = false;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == task_fd) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t r = ::read(task_fd, &count, sizeof count);
      }
    }
  }

  void loop() {
    int idle_polls = 0;
    for (;;) {
      std::deque<std::function<void()>> batch;
      {
        std::lock_guard<std::mutex> lock(mutex);
        // stop() ran shutdown() first: no worker is left to complete a transfer still in flight
        // (one posted to a dead peer, say), so nothing more can happen.
        if (stopping && tasks.empty()) return;
        batch.swap(tasks);
      }
      for (auto& task : batch) guarded([&] { task(); });
      bool progressed = false;
      for (auto& [rank, worker] : workers) {
        while (ucp_worker_progress(worker) != 0) progressed = true;
      }
      if (progressed || !batch.empty()) {
        idle_polls = 0;
      } else if (in_flight > 0 && idle_polls < kSpinPolls) {
        ++idle_polls;
        std::this_thread::yield();
      } else {
        sleep_until_event(in_flight > 0 ? kSleepLimitMs : -1);
        idle_polls = 0;
      }
    }
  }

  // Runs f on the progress thread; what it throws (a bug, or memory running out) is reported as a
  // failure of this world, which ends the job through the failure action, instead of terminating
  // the process with no word from atoll. Its operation never completes.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      failed(std::string("the progress thread failed: ") + e.what(), PeerEnds::kNoPeer, TransferFailure::broken);
    } catch (...) {
      failed("the progress thread failed (an unknown exception)", PeerEnds::kNoPeer, TransferFailure::broken);
    }
  }

  // --- transfers (progress thread) ---
  struct Request {
    Impl* impl;
    std::shared_ptr<Operation> op;
    int peer;  // a send's remote rank; -1 for a receive (not bound to an endpoint)
    std::size_t bytes = 0;  // the message's size (a receive checks what arrives against it)
    std::uint64_t tag = 0;
    const char* what() const { return peer >= 0 ? "send" : "receive"; }
  };

  static void part_done(const std::shared_ptr<Operation>& op) {
    if (--op->remaining == 0) op->finish();
  }

  // A transfer to or from a process that died fails here; its operation never completes, and
  // the job's control plane (which sees the process go) stops this one, naming the lost node.
  // Both processes alive (the data network failed, the control connections did not), nothing
  // would stop the job: the on_transfer_failure action does, once its grace has passed.
  void transfer_failed(const char* what, ucs_status_t status, int peer) {
    if (ends.explains(peer)) return;  // it finished the job, or may now: its end, not a failure
    const std::string with = peer >= 0 ? " with " + rank_name(peer) : "";
    failed(std::string("a ") + what + with + " failed (" + ucs_status_string(status) + "); a peer process is gone",
           peer, TransferFailure::broken);
  }

  // A receive whose message was not the size the collective expects: the processes disagree about
  // the collective (different builds or plans). Its operation never completes (its buffer would
  // hold stale bytes), so the failure action ends the job, naming the mismatch.
  void size_mismatch(const Request& r, const std::string& got) {
    failed("a receive of " + std::to_string(r.bytes) + " bytes (" + describe_tag(r.tag) + ") got " + got +
               ": the processes disagree about a collective (different atoll builds or job plans)",
           PeerEnds::kNoPeer, TransferFailure::disagreement);
  }

  // A tag as the group, operation and sender it stands for (make_tag's fields).
  std::string describe_tag(std::uint64_t tag) {
    const std::uint64_t op = (tag >> 16) & 0xFFFFFF;
    const int source = static_cast<int>(tag & 0xFFFF);
    std::string group = "an unknown group", sender = "member " + std::to_string(source);
    {
      std::lock_guard<std::mutex> lock(ids_mutex);
      if (const auto it = ids.find(tag >> 40); it != ids.end()) {
        group = it->second.describe();
        if (source < static_cast<int>(it->second.ranks.size())) {
          sender = rank_name(it->second.ranks[static_cast<std::size_t>(source)]);
        }
      }
    }
    const bool p2p = (op & kPointToPoint) != 0;
    return group + (p2p ? " send/recv #" : " collective #") + std::to_string(op & (kPointToPoint - 1)) + ", from " +
           sender;
  }

  // Says `message` (the first failure, and the first disagreement) and arms the
  // on_transfer_failure action.
  void failed(const std::string& message, int peer, TransferFailure kind) {
    if (ending) return;  // this world's shutdown cancels what is in flight
    const bool first = ends.note_failure(peer);
    const bool first_disagreement = kind == TransferFailure::disagreement && !disagreement_seen.exchange(true);
    if (first || first_disagreement) {
      std::fprintf(stderr, "%satoll ucx: %s\n", message_prefix.c_str(), message.c_str());
      std::fflush(stderr);
    }
    if (stuck && !stuck_armed.exchange(true)) {
      std::thread([grace = stuck_grace, action = stuck, world = self] {
        std::this_thread::sleep_for(grace);
        // A world that is ending is a process ending its own way; a failure its peers' goodbyes
        // explain since is their end, not a broken network (a later failure arms it again).
        const std::shared_ptr<Impl> impl = world.lock();
        if (!impl || impl->ending) return;
        if (impl->ends.failure_unexplained()) {
          action(impl->disagreement_seen ? TransferFailure::disagreement : TransferFailure::broken);
        } else {
          impl->stuck_armed = false;
        }
      }).detach();
    }
  }

  // A transfer's end: its part of the operation done, or its failure reported. `received`: a
  // receive's message size (nullopt for a send).
  void transfer_ended(const Request& r, ucs_status_t status, std::optional<std::size_t> received) {
    if (status == UCS_ERR_MESSAGE_TRUNCATED) {
      size_mismatch(r, "a longer message");
    } else if (status != UCS_OK) {
      transfer_failed(r.what(), status, r.peer);
    } else if (received && *received != r.bytes) {
      size_mismatch(r, std::to_string(*received));
    } else {
      part_done(r.op);
    }
  }

  // A transfer's completion (UCX's callback, once it did not complete at once).
  static void transfer_done(void* request, ucs_status_t status, void* user, std::optional<std::size_t> received) {
    auto* r = static_cast<Request*>(user);
    r->impl->in_flight -= 1;
    r->impl->guarded([&] { r->impl->transfer_ended(*r, status, received); });  // never through UCX's frames
    delete r;
    ucp_request_free(request);
  }
  static void send_done(void* request, ucs_status_t status, void* user) {
    transfer_done(request, status, user, std::nullopt);
  }
  static void recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
    transfer_done(request, status, user, info ? std::optional<std::size_t>(info->length) : std::nullopt);
  }

  // An immediately completed transfer (sends only) returns nullptr and runs no callback.
  void settle(ucs_status_ptr_t status, Request* r) {
    if (status == nullptr || UCS_PTR_IS_ERR(status)) {
      guarded([&] { transfer_ended(*r, UCS_PTR_STATUS(status), std::nullopt); });  // the rest still posts
      delete r;
    } else {
      in_flight += 1;
    }
  }

  static ucp_request_param_t callback_param(Request* r) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.user_data = r;
    return param;
  }

  // (Nothing is posted once shutdown() began closing: a completion it progressed may start the
  // next transfer of an operation, on an endpoint already closed.)
  void send(int from, int to, const void* data, std::size_t bytes, std::uint64_t tag, std::shared_ptr<Operation> op) {
    if (closing) return;
    const ucp_ep_h ep = endpoints.at({from, to});  // (before the request: a throw leaves nothing behind)
    auto* r = new Request{this, std::move(op), to, bytes, tag};
    ucp_request_param_t param = callback_param(r);
    param.cb.send = &send_done;
    settle(ucp_tag_send_nbx(ep, data, bytes, tag, &param), r);
  }

  void recv(int at, void* data, std::size_t bytes, std::uint64_t tag, std::shared_ptr<Operation> op) {
    if (closing) return;
    const ucp_worker_h worker = workers.at(at);
    auto* r = new Request{this, std::move(op), -1, bytes, tag};
    ucp_request_param_t param = callback_param(r);
    param.cb.recv = &recv_done;
    // Completed through the callback always, which receives the message's size (UCX 1.13 leaves
    // recv_info unset when a receive completes at once).
    param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    settle(ucp_tag_recv_nbx(worker, data, bytes, tag, ~std::uint64_t{0}, &param), r);
  }

  // Closes everything on the progress thread, then ends it.
  void stop() {
    if (!thread.joinable()) return;
    ending = true;
    call<void>([this] { shutdown(); });
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    signal();
    thread.join();
  }

  // Ends every transfer this process still owes its peers, then closes. A completed send only
  // means its buffer may be reused: UCX may still hold the message (over tcp, the unsent part of
  // a socket write), and a forced close would drop it while a peer still waits for it. So a world
  // ending without a failure first flushes its endpoints to the peers still in the job (one that
  // said goodbye needs nothing more), together, for at most kFlushLimit: a peer that stopped
  // reading must not hold up this end. (A flush still running then ends with the forced close.)
  static constexpr auto kFlushLimit = std::chrono::seconds(2);
  void flush_endpoints() {
    std::vector<ucs_status_ptr_t> flushing;
    for (auto& [key, ep] : endpoints) {
      if (!ends.owed_flush(key.second)) continue;
      ucp_request_param_t param{};
      const ucs_status_ptr_t req = ucp_ep_flush_nbx(ep, &param);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) flushing.push_back(req);
    }
    const auto deadline = std::chrono::steady_clock::now() + kFlushLimit;
    auto running = [&] {
      return std::any_of(flushing.begin(), flushing.end(),
                         [](ucs_status_ptr_t req) { return ucp_request_check_status(req) == UCS_INPROGRESS; });
    };
    while (running() && std::chrono::steady_clock::now() < deadline) {
      for (auto& [rank, worker] : workers) ucp_worker_progress(worker);
    }
    for (ucs_status_ptr_t req : flushing) ucp_request_free(req);
  }

  void shutdown() {
    // (A failure its peer's goodbye explains is that peer's end: the others still get their flush.)
    if (!ends.failure_unexplained()) flush_endpoints();
    closing = true;
    for (auto& [key, ep] : endpoints) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(workers.at(key.first));
        ucp_request_free(req);
      }
    }
    endpoints.clear();
    for (auto& [rank, worker] : workers) ucp_worker_destroy(worker);
    workers.clear();
    if (context) ucp_cleanup(context);
    context = nullptr;
  }
};

namespace {

// This member's side of a reduction over a group, pipelined. Member j's range of the input goes
// to member j in chunks of kChunkFloats; the members' chunks of this member's range arrive into
// kStagingDepth staging slots per member, and each chunk is summed over the pairwise tree of member
// index (kernels/tree_sum_arrays.hpp: the sim backend's order, so its bits) as soon as every
// member's has arrived, in chunk order, while the next chunks travel. UCX matches the messages of
// one tag from one endpoint in order, so a member's chunks share its tag. Progress thread only.
class ChunkedReduction : public std::enable_shared_from_this<ChunkedReduction> {
 public:
  using Range = std::pair<std::int64_t, std::int64_t>;  // [begin, end) of the input

  ChunkedReduction(UcxWorld::Impl& world, std::vector<int> ranks, int rank, int me, std::uint64_t id,
                   std::uint64_t op, const float* in, std::vector<Range> ranges, float* out)
      : world_(world), ranks_(std::move(ranks)), rank_(rank), me_(me), id_(id), op_(op), in_(in),
        ranges_(std::move(ranges)), out_(out) {}

  // Posts every transfer; `whole` finishes once every chunk is sent and every chunk summed.
  void post(std::shared_ptr<Operation> whole) {
    whole_ = std::move(whole);
    const int size = static_cast<int>(ranks_.size());
    const int own_chunks = chunks_of(me_);
    int sends = 0;
    for (int j = 0; j < size; ++j) sends += j == me_ ? 0 : chunks_of(j);
    whole_->remaining = sends + own_chunks + 1;
    ready_.assign(static_cast<std::size_t>(own_chunks), false);
    slots_.resize(static_cast<std::size_t>(size * kStagingDepth));
    for (int j = 0; j < size; ++j) {
      for (int s = 0; j != me_ && s < kStagingDepth && s < own_chunks; ++s) slots_[slot_index(j, s)] = world_.take_slot();
    }
    // Receives are matched in the order they are posted, so chunks are posted strictly in order:
    // a chunk whose messages already wait here completes while posted, and its sum (which posts
    // a later chunk) must wait until the first chunks are all posted.
    summing_ = true;
    for (int c = 0; c < std::min(kStagingDepth, own_chunks); ++c) post_chunk(c);
    summing_ = false;
    for (int j = 0; j < size; ++j) {
      if (j == me_) continue;
      for (int c = 0; c < chunks_of(j); ++c) {
        world_.send(rank_, ranks_[static_cast<std::size_t>(j)], in_ + ranges_[static_cast<std::size_t>(j)].first + c * kChunkFloats,
                    chunk_floats(j, c) * sizeof(float), make_tag(id_, op_, me_), whole_);
      }
    }
    drain();
    UcxWorld::Impl::part_done(whole_);  // the posting's own part
  }

 private:
  std::int64_t length(int j) const { return ranges_[static_cast<std::size_t>(j)].second - ranges_[static_cast<std::size_t>(j)].first; }
  int chunks_of(int j) const {  // an empty range still sends one (empty) message
    return static_cast<int>(std::max<std::int64_t>(1, (length(j) + kChunkFloats - 1) / kChunkFloats));
  }
  std::size_t chunk_floats(int j, int c) const {
    return static_cast<std::size_t>(std::min(kChunkFloats, length(j) - c * kChunkFloats));
  }
  std::size_t slot_index(int j, int c) const { return static_cast<std::size_t>(j * kStagingDepth + c % kStagingDepth); }

  // Receives chunk c of this member's range from every other member.
  void post_chunk(int c) {
    const int size = static_cast<int>(ranks_.size());
    auto arrived = std::make_shared<Operation>();
    arrived->remaining = size;  // size - 1 receives and the posting
    arrived->finish = [self = shared_from_this(), c] { self->arrived(c); };
    for (int j = 0; j < size; ++j) {
      if (j == me_) continue;
      world_.recv(rank_, slots_[slot_index(j, c)].get(), chunk_floats(me_, c) * sizeof(float), make_tag(id_, op_, j),
                  arrived);
    }
    UcxWorld::Impl::part_done(arrived);
  }

  // A chunk that arrives while chunks are posted or summed waits for that loop to take it.
  void arrived(int c) {
    ready_[static_cast<std::size_t>(c)] = true;
    if (!summing_) drain();
  }

  // Sums the arrived chunks in order, posting the chunk that takes each one's slots.
  void drain() {
    summing_ = true;
    const int chunks = static_cast<int>(ready_.size());
    while (next_ < chunks && ready_[static_cast<std::size_t>(next_)]) {
      const int k = next_++;
      sum_chunk(k);
      if (k + kStagingDepth < chunks) post_chunk(k + kStagingDepth);
      if (next_ == chunks) {  // the slots go back before the operation can finish
        for (auto& slot : slots_) {
          if (slot && world_.free_slots.size() < kMaxFreeSlots) world_.free_slots.push_back(std::move(slot));
          slot.reset();
        }
      }
      UcxWorld::Impl::part_done(whole_);
    }
    summing_ = false;
  }

  void sum_chunk(int k) {
    const int size = static_cast<int>(ranks_.size());
    const std::int64_t at = k * kChunkFloats;
    std::vector<const float*> parts(static_cast<std::size_t>(size));
    for (int j = 0; j < size; ++j) {
      parts[static_cast<std::size_t>(j)] = j == me_ ? in_ + ranges_[static_cast<std::size_t>(me_)].first + at : slots_[slot_index(j, k)].get();
    }
    tree_sum_arrays(parts.data(), size, static_cast<std::int64_t>(chunk_floats(me_, k)), out_ + at);
  }

  UcxWorld::Impl& world_;
  std::vector<int> ranks_;
  int rank_, me_;
  std::uint64_t id_, op_;
  const float* in_;
  std::vector<Range> ranges_;
  float* out_;
  std::shared_ptr<Operation> whole_;
  std::vector<std::unique_ptr<float[]>> slots_;  // (member, slot) at member * kStagingDepth + slot
  std::vector<bool> ready_;
  int next_ = 0;
  bool summing_ = false;
};

// One rank's communicator in one group.
class UcxCommunicator final : public Communicator {
 public:
  UcxCommunicator(std::shared_ptr<UcxWorld::Impl> world, Group group, int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank), me_(group_.index_of(rank)),
        id_(group_id(group_)), checks_("ucx", group_, rank) {}

  int rank() const override { return rank_; }
  const Group& group() const override { return group_; }

  void all_gather(const Tensor& send, const Tensor& recv, const std::string& tag, Completion done) override {
    checks_.all_gather(send, recv, tag);
    const int size = group_.size();
    const std::uint64_t op = next_op();
    auto operation = start(CollectiveKind::all_gather, send, tag, std::move(done), 2 * (size - 1) + 1);
    operation->keep = {send, recv};
    world_->post([=, world = world_, ranks = group_.ranks, rank = rank_, me = me_, id = id_] {
      const std::size_t block = send.bytes();
      auto* out = static_cast<std::byte*>(recv.raw());
      for (int j = 0; j < size; ++j) {
        if (j == me) continue;
        world->send(rank, ranks[j], send.raw(), block, make_tag(id, op, me), operation);
        world->recv(rank, out + static_cast<std::size_t>(j) * block, block, make_tag(id, op, j), operation);
      }
    });
    // This member's own block, copied here while the transfers travel; the posting's part is
    // released after it, so the operation cannot finish first.
    std::byte* own = static_cast<std::byte*>(recv.raw()) + static_cast<std::size_t>(me_) * send.bytes();
    if (own != send.raw()) std::memmove(own, send.raw(), send.bytes());  // in place: nothing to copy
    world_->post([operation] { UcxWorld::Impl::part_done(operation); });
  }

  void reduce_scatter(const Tensor& send, const Tensor& recv, const std::string& tag, Completion done) override {
    checks_.reduce_scatter(send, recv, tag);
    const int size = group_.size();
    const std::int64_t n = recv.numel();
    std::vector<ChunkedReduction::Range> ranges;
    for (std::int64_t j = 0; j < size; ++j) ranges.emplace_back(j * n, (j + 1) * n);
    auto reduction = std::make_shared<ChunkedReduction>(*world_, group_.ranks, rank_, me_, id_, next_op(),
                                                        send.data<float>(), std::move(ranges), recv.data<float>());
    auto operation = start(CollectiveKind::reduce_scatter, send, tag, std::move(done), 0);
    operation->keep = {send, recv};
    world_->post([reduction, operation] { reduction->post(operation); });
  }

  void all_reduce(const Tensor& inout, const std::string& tag, Completion done) override {
    checks_.all_reduce(inout, tag);
    const int size = group_.size();
    const std::uint64_t op = next_op(), gather_op = next_op();  // two exchanges, numbered in order
    const std::int64_t N = inout.numel();
    std::vector<ChunkedReduction::Range> ranges;
    for (std::int64_t i = 0; i < size; ++i) ranges.emplace_back(i * N / size, (i + 1) * N / size);
    const auto [lo, hi] = ranges[static_cast<std::size_t>(me_)];
    float* data = inout.data<float>();
    auto reduction = std::make_shared<ChunkedReduction>(*world_, group_.ranks, rank_, me_, id_, op, data, ranges,
                                                        data + lo);
    // Phase 2 (after every chunk of phase 1 arrived, was summed and left): the sums to every member.
    auto gathered = start(CollectiveKind::all_reduce, inout, tag, std::move(done), 2 * (size - 1) + 1);
    gathered->keep = {inout};
    auto reduced = std::make_shared<Operation>();
    reduced->keep = {inout};
    reduced->finish = [=, world = world_, ranks = group_.ranks, rank = rank_, me = me_, id = id_] {
      for (int j = 0; j < size; ++j) {
        if (j == me) continue;
        const auto [jl, jh] = ranges[static_cast<std::size_t>(j)];
        world->send(rank, ranks[j], data + lo, static_cast<std::size_t>(hi - lo) * 4,
                     make_tag(id, gather_op, me), gathered);
        world->recv(rank, data + jl, static_cast<std::size_t>(jh - jl) * 4, make_tag(id, gather_op, j), gathered);
      }
      UcxWorld::Impl::part_done(gathered);
    };
    world_->post([reduction, reduced] { reduction->post(reduced); });
  }

  void broadcast(const Tensor& inout, int root, const std::string& tag, Completion done) override {
    checks_.broadcast(inout, root, tag);
    const int size = group_.size();
    const std::uint64_t op = next_op();
    const bool is_root = me_ == root;
    auto operation = start(CollectiveKind::broadcast, inout, tag, std::move(done), (is_root ? size - 1 : 1) + 1,
                           is_root ? static_cast<std::int64_t>(inout.bytes()) : 0);
    operation->keep = {inout};
    world_->post([=, world = world_, ranks = group_.ranks, rank = rank_, me = me_, id = id_] {
      if (is_root) {
        for (int j = 0; j < size; ++j) {
          if (j != me) world->send(rank, ranks[j], inout.raw(), inout.bytes(), make_tag(id, op, me), operation);
        }
      } else {
        world->recv(rank, inout.raw(), inout.bytes(), make_tag(id, op, root), operation);
      }
      UcxWorld::Impl::part_done(operation);
    });
  }

  void all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts, const Tensor& recv,
                    const std::vector<std::int64_t>& recv_counts, const std::string& tag, Completion done) override {
    checks_.all_to_all_v(send, send_counts, recv, recv_counts, tag);
    const int size = group_.size();
    const std::uint64_t op = next_op();
    const std::size_t element = element_size(send.dtype());
    // One message each way per peer, empty blocks too: a peer that sends where none is expected
    // (or nothing where a block is) then fails the receive's size check instead of leaving a
    // message unmatched, or this member waiting, with nothing said.
    const int transfers = 2 * (size - 1);
    auto operation = start(CollectiveKind::all_to_all_v, send, tag, std::move(done), transfers + 1);
    operation->keep = {send, recv};
    world_->post([=, world = world_, ranks = group_.ranks, rank = rank_, me = me_, id = id_] {
      auto* in = static_cast<const std::byte*>(send.raw());
      auto* out = static_cast<std::byte*>(recv.raw());
      std::int64_t in_at = 0, out_at = 0;
      for (int j = 0; j < size; ++j) {
        const std::size_t sb = static_cast<std::size_t>(send_counts[j]) * element;
        const std::size_t rb = static_cast<std::size_t>(recv_counts[j]) * element;
        if (j != me) {
          world->send(rank, ranks[j], in + in_at * static_cast<std::int64_t>(element), sb, make_tag(id, op, me),
                      operation);
          world->recv(rank, out + out_at * static_cast<std::int64_t>(element), rb, make_tag(id, op, j), operation);
        }
        in_at += send_counts[j];
        out_at += recv_counts[j];
      }
      // This member's own block, before the posting's part is released: the operation finishes
      // only after it, however fast the transfers complete.
      std::int64_t own_in = 0, own_out = 0;
      for (int j = 0; j < me; ++j) {
        own_in += send_counts[j];
        own_out += recv_counts[j];
      }
      std::memmove(out + own_out * static_cast<std::int64_t>(element), in + own_in * static_cast<std::int64_t>(element),
                   static_cast<std::size_t>(send_counts[me]) * element);
      UcxWorld::Impl::part_done(operation);
    });
  }

  void send(const Tensor& tensor, int peer, const std::string& tag, Completion done) override {
    checks_.point_to_point("send", tensor, peer, tag);
    const std::uint64_t op = kPointToPoint | (sent_[peer]++ & 0x7FFFFF);
    auto operation = start(CollectiveKind::send, tensor, tag, std::move(done), 2);
    operation->keep = {tensor};
    world_->post([=, world = world_, ranks = group_.ranks, rank = rank_, me = me_, id = id_] {
      world->send(rank, ranks[peer], tensor.raw(), tensor.bytes(), make_tag(id, op, me), operation);
      UcxWorld::Impl::part_done(operation);
    });
  }

  void recv(const Tensor& tensor, int peer, const std::string& tag, Completion done) override {
    checks_.point_to_point("recv", tensor, peer, tag);
    const std::uint64_t op = kPointToPoint | (received_[peer]++ & 0x7FFFFF);
    auto operation = start(CollectiveKind::recv, tensor, tag, std::move(done), 2, 0);
    operation->keep = {tensor};
    world_->post([=, world = world_, id = id_, rank = rank_] {
      world->recv(rank, tensor.raw(), tensor.bytes(), make_tag(id, op, peer), operation);
      UcxWorld::Impl::part_done(operation);
    });
  }

 private:
  std::uint64_t next_op() { return ops_++ & 0x7FFFFF; }

  // An operation of `transfers` transfers; when they are done: the record, then the caller's
  // completion. `bytes` < 0: the send tensor's.
  std::shared_ptr<Operation> start(CollectiveKind kind, const Tensor& send, const std::string& tag, Completion done,
                                   int transfers, std::int64_t bytes = -1) {
    const auto& recorder = world_->recorder;
    CollectiveRecord record = recorder->posted(
        kind, group_, send.dtype(), bytes < 0 ? static_cast<std::int64_t>(send.bytes()) : bytes, tag, rank_);
    auto op = std::make_shared<Operation>();
    op->remaining = transfers;
    op->finish = CollectiveRecorder::finishing(recorder, std::move(record), std::move(done));
    return op;
  }

  std::shared_ptr<UcxWorld::Impl> world_;
  Group group_;
  int rank_, me_;
  std::uint64_t id_;
  CollectiveChecks checks_;
  std::uint64_t ops_ = 0;
  std::map<int, std::uint64_t> sent_, received_;  // send/recv streams per peer
};

}  // namespace

UcxWorld::UcxWorld(int world_size, std::vector<int> local_ranks, std::shared_ptr<CollectiveRecorder> recorder,
                   bool peer_errors)
    : impl_(std::make_shared<Impl>()) {
  impl_->self = impl_;
  auto& im = *impl_;
  im.peer_errors = peer_errors;
  im.world_size = world_size;
  im.local = std::move(local_ranks);
  im.recorder = recorder ? std::move(recorder) : std::make_shared<CollectiveRecorder>();
  for (int r : im.local) {
    if (r < 0 || r >= world_size) throw std::invalid_argument("ucx: rank " + std::to_string(r) + " outside the job");
  }
  im.task_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  im.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (im.task_fd < 0 || im.epoll_fd < 0) throw std::runtime_error("ucx: cannot create the progress thread's event fds");
  im.watch(im.task_fd);
  im.thread = std::thread([impl = impl_.get()] { impl->loop(); });
  try {
    im.call<void>([impl = impl_.get()] {
      ucp_config_t* config = nullptr;
      check(ucp_config_read(nullptr, nullptr, &config), "reading the configuration");
      ucp_params_t params{};
      params.field_mask = UCP_PARAM_FIELD_FEATURES;
      params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
      const ucs_status_t status = ucp_init(&params, config, &impl->context);
      ucp_config_release(config);
      check(status, "ucp_init");
      for (int r : impl->local) {
        ucp_worker_params_t wp{};
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SINGLE;
        ucp_worker_h worker = nullptr;
        check(ucp_worker_create(impl->context, &wp, &worker), "creating a worker");
        impl->workers[r] = worker;
        int efd = -1;
        check(ucp_worker_get_efd(worker, &efd), "the worker's event fd");
        impl->watch(efd);
      }
    });
  } catch (...) {
    im.stop();
    throw;
  }
}

UcxWorld::~UcxWorld() { impl_->stop(); }

void UcxWorld::on_transfer_failure(std::chrono::milliseconds grace, std::function<void(TransferFailure)> action) {
  impl_->call<void>([impl = impl_.get(), grace, action = std::move(action)]() mutable {
    impl->stuck_grace = grace;
    impl->stuck = std::move(action);
  });
}

void UcxWorld::set_message_prefix(std::string prefix) {
  impl_->call<void>([impl = impl_.get(), prefix = std::move(prefix)]() mutable { impl->message_prefix = std::move(prefix); });
}

void UcxWorld::said_goodbye(const std::vector<int>& remote_ranks) { impl_->ends.said_goodbye(remote_ranks); }
void UcxWorld::expect_end(const std::vector<int>& remote_ranks) { impl_->ends.end_expected(remote_ranks); }

void UcxWorld::name_ranks(std::function<std::string(int)> name) {
  impl_->call<void>([impl = impl_.get(), name = std::move(name)]() mutable { impl->rank_name = std::move(name); });
}

int UcxWorld::world_size() const { return impl_->world_size; }
const std::shared_ptr<CollectiveRecorder>& UcxWorld::recorder() const { return impl_->recorder; }

std::map<int, WorkerAddress> UcxWorld::local_addresses() const {
  return impl_->call<std::map<int, WorkerAddress>>([impl = impl_.get()] {
    std::map<int, WorkerAddress> out;
    for (auto& [rank, worker] : impl->workers) {
      ucp_address_t* address = nullptr;
      std::size_t length = 0;
      check(ucp_worker_get_address(worker, &address, &length), "worker address");
      const auto* bytes = reinterpret_cast<const std::byte*>(address);
      out[rank] = WorkerAddress(bytes, bytes + length);
      ucp_worker_release_address(worker, address);
    }
    return out;
  });
}

void UcxWorld::connect(const std::map<int, WorkerAddress>& addresses) {
  for (int r = 0; r < impl_->world_size; ++r) {
    if (!addresses.count(r)) throw std::invalid_argument("ucx: no worker address for rank " + std::to_string(r));
  }
  impl_->call<void>([impl = impl_.get(), addresses] {
    for (auto& [rank, worker] : impl->workers) {
      for (const auto& [remote, address] : addresses) {
        if (remote == rank) continue;
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        params.address = reinterpret_cast<const ucp_address_t*>(address.data());
        if (impl->peer_errors) {
          params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
          params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
          params.err_handler.cb = &Impl::endpoint_failed;
          params.err_handler.arg = impl;
        }
        ucp_ep_h ep = nullptr;
        // UCP_FEATURE_WAKEUP admits only transports that signal events (tcp, shared memory and
        // InfiniBand all do in UCX 1.13).
        check(ucp_ep_create(worker, &params, &ep), "creating an endpoint (over a transport with event support)");
        impl->endpoints[{rank, remote}] = ep;
      }
    }
  });
}

std::unique_ptr<Communicator> UcxWorld::communicator(const Group& group, int rank) {
  if (std::find(impl_->local.begin(), impl_->local.end(), rank) == impl_->local.end()) {
    throw std::invalid_argument("ucx: rank " + std::to_string(rank) + " does not live in this process");
  }
  group.index_of(rank);  // throws when it is not a member
  {
    // Tags carry a 24-bit hash of the group: two groups of this process's ranks with one hash
    // would take each other's messages, so that is refused rather than risked.
    std::lock_guard<std::mutex> lock(impl_->ids_mutex);
    const auto [it, inserted] = impl_->ids.emplace(group_id(group), group);
    if (!inserted && it->second.describe() != group.describe()) {
      throw std::invalid_argument("ucx: groups " + it->second.describe() + " and " + group.describe() +
                                  " have the same 24-bit tag id; their messages could not be told apart");
    }
  }
  return std::make_unique<UcxCommunicator>(impl_, group, rank);
}

}  // namespace atl
