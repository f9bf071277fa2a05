#include "comm/sim/sim_world.hpp"

#include "comm/collective_checks.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/tree_sum_arrays.hpp"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;

// One member's call, as registered for the rendezvous.
struct Post {
  CollectiveKind kind = CollectiveKind::all_reduce;
  DType dtype = DType::f32;
  int member = -1;  // group index of the poster
  int rank = -1;    // its global rank
  Tensor send;      // all_reduce / broadcast: the in-out tensor (also in recv)
  Tensor recv;
  std::vector<std::int64_t> send_counts, recv_counts;  // all_to_all_v
  int root = -1;                                       // broadcast
  int peer = -1;                                       // send / recv
  std::string tag;
  Completion done;  // already wrapped with the record
};

// An operation whose members have all posted: its data can move.
struct ReadyOp {
  std::vector<Post> posts;  // collectives: by member index; send/recv: {send, recv}
  Clock::time_point ready;  // when the last member posted
};

struct PendingCollective {
  std::vector<std::optional<Post>> posts;  // by member index
  int posted = 0;
};

// Messages from one member to another, paired in FIFO order.
struct Channel {
  std::deque<Post> sends, recvs;
  std::int64_t sends_posted = 0, recvs_posted = 0;
};

std::string shape_of(const Tensor& t) { return t.describe(); }

std::string describe_call(const Post& p) {
  std::string s = collective_name(p.kind);
  switch (p.kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
      return s + "(send " + shape_of(p.send) + ", recv " + shape_of(p.recv) + ")";
    case CollectiveKind::all_reduce: return s + "(" + shape_of(p.send) + ")";
    case CollectiveKind::broadcast: return s + "(" + shape_of(p.send) + ", root " + std::to_string(p.root) + ")";
    case CollectiveKind::all_to_all_v:
      return s + "(send " + shape_of(p.send) + " counts " + counts_text(p.send_counts) + ", recv " +
             shape_of(p.recv) + " counts " + counts_text(p.recv_counts) + ")";
    case CollectiveKind::send: return s + "(" + shape_of(p.send) + " to member " + std::to_string(p.peer) + ")";
    case CollectiveKind::recv: return s + "(" + shape_of(p.recv) + " from member " + std::to_string(p.peer) + ")";
  }
  return s;
}

std::string who(const Post& p) {
  return "member " + std::to_string(p.member) + " (rank " + std::to_string(p.rank) + ", tag '" + p.tag + "')";
}

[[noreturn]] void throw_mismatch(const Group& group, const std::string& op, const Post& mine, const Post& other,
                                 const std::string& reason) {
  throw std::logic_error("sim comm: mismatch in group " + group.describe() + " " + op + ": " + who(mine) +
                         " posted " + describe_call(mine) + " but " + who(other) + " posted " +
                         describe_call(other) + " (" + reason + ")");
}

// Throws if `mine` cannot take part in the same collective as `other` (already posted).
void check_collective_match(const Group& group, std::int64_t op_number, const Post& mine, const Post& other) {
  const std::string op = "op #" + std::to_string(op_number);
  if (mine.kind != other.kind) throw_mismatch(group, op, mine, other, "kinds differ");
  if (mine.dtype != other.dtype) throw_mismatch(group, op, mine, other, "dtypes differ");
  switch (mine.kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_reduce:
      if (mine.send.numel() != other.send.numel() || mine.recv.numel() != other.recv.numel()) {
        throw_mismatch(group, op, mine, other, "sizes differ");
      }
      break;
    case CollectiveKind::broadcast:
      if (mine.send.numel() != other.send.numel()) throw_mismatch(group, op, mine, other, "sizes differ");
      if (mine.root != other.root) throw_mismatch(group, op, mine, other, "roots differ");
      break;
    case CollectiveKind::all_to_all_v: {
      const auto i = static_cast<std::size_t>(mine.member);
      const auto j = static_cast<std::size_t>(other.member);
      if (mine.send_counts[j] != other.recv_counts[i] || mine.recv_counts[j] != other.send_counts[i]) {
        throw_mismatch(group, op, mine, other,
                       "counts disagree: member " + std::to_string(i) + " sends " +
                           std::to_string(mine.send_counts[j]) + " to member " + std::to_string(j) +
                           " which expects " + std::to_string(other.recv_counts[i]) + ", and receives " +
                           std::to_string(mine.recv_counts[j]) + " from it which sends " +
                           std::to_string(other.send_counts[i]));
      }
      break;
    }
    case CollectiveKind::send:
    case CollectiveKind::recv: break;
  }
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

// Sum over members of their f32 send buffers (n elements), in the pairwise tree of member index
// (kernels/tree_sum_arrays), into out.
void tree_sum_f32(const std::vector<Post>& posts, std::int64_t n, float* out) {
  std::vector<const float*> parts;
  for (const Post& p : posts) parts.push_back(static_cast<const float*>(p.send.raw()));
  tree_sum_arrays(parts.data(), static_cast<int>(parts.size()), n, out);
}

// Moves the data of a ready operation. Inputs are staged before any output is written, so send
// and receive buffers may alias (an in-place all_gather, say).
void move_data(ReadyOp& op) {
  std::vector<Post>& posts = op.posts;
  const std::size_t size = posts.size();
  const std::size_t element = element_size(posts[0].dtype);
  switch (posts[0].kind) {
    case CollectiveKind::all_gather: {
      const std::size_t block = posts[0].send.bytes();
      std::vector<std::byte> gathered(size * block);
      for (std::size_t j = 0; j < size; ++j) copy_bytes(gathered.data() + j * block, posts[j].send.raw(), block);
      for (const Post& p : posts) copy_bytes(p.recv.raw(), gathered.data(), gathered.size());
      break;
    }
    case CollectiveKind::reduce_scatter: {
      std::vector<float> sum(static_cast<std::size_t>(posts[0].send.numel()));
      tree_sum_f32(posts, posts[0].send.numel(), sum.data());
      const std::size_t block = static_cast<std::size_t>(posts[0].recv.numel());
      for (std::size_t i = 0; i < size; ++i) {
        copy_bytes(posts[i].recv.raw(), sum.data() + i * block, block * sizeof(float));
      }
      break;
    }
    case CollectiveKind::all_reduce: {
      std::vector<float> sum(static_cast<std::size_t>(posts[0].send.numel()));
      tree_sum_f32(posts, posts[0].send.numel(), sum.data());
      for (const Post& p : posts) copy_bytes(p.send.raw(), sum.data(), sum.size() * sizeof(float));
      break;
    }
    case CollectiveKind::broadcast: {
      const Tensor& source = posts[static_cast<std::size_t>(posts[0].root)].send;
      std::vector<std::byte> staged(source.bytes());
      copy_bytes(staged.data(), source.raw(), staged.size());
      for (const Post& p : posts) copy_bytes(p.send.raw(), staged.data(), staged.size());
      break;
    }
    case CollectiveKind::all_to_all_v: {
      std::vector<std::vector<std::byte>> staged(size);
      for (std::size_t j = 0; j < size; ++j) {
        staged[j].resize(posts[j].send.bytes());
        copy_bytes(staged[j].data(), posts[j].send.raw(), staged[j].size());
      }
      for (std::size_t i = 0; i < size; ++i) {
        auto* out = static_cast<std::byte*>(posts[i].recv.raw());
        std::int64_t out_offset = 0;
        for (std::size_t j = 0; j < size; ++j) {
          std::int64_t in_offset = 0;  // where member j's block for member i starts
          for (std::size_t k = 0; k < i; ++k) in_offset += posts[j].send_counts[k];
          const std::int64_t count = posts[i].recv_counts[j];
          copy_bytes(out + out_offset * element, staged[j].data() + in_offset * element,
                     static_cast<std::size_t>(count) * element);
          out_offset += count;
        }
      }
      break;
    }
    case CollectiveKind::send:
    case CollectiveKind::recv:  // posts = {send, recv}
      copy_bytes(posts[1].recv.raw(), posts[0].send.raw(), posts[0].send.bytes());
      break;
  }
}

void run_completion(Completion& done) noexcept {
  try {
    if (done) done();
  } catch (const std::bad_alloc&) {
    std::terminate();  // out of memory: nothing can go on (atoll-train prints it and exits 1)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atoll sim comm: a completion threw: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "atoll sim comm: a completion threw a non-standard exception\n");
    std::abort();
  }
}

// The rendezvous state of one group (axis + ranks). Guarded by SimWorld::Impl::mutex, except
// last_fire, which only the thread draining the group touches.
struct GroupState {
  explicit GroupState(Group g)
      : group(std::move(g)), next_op(static_cast<std::size_t>(group.size()), 0),
        last_fire(static_cast<std::size_t>(group.size())) {}

  Group group;
  std::vector<std::int64_t> next_op;  // per member: the number of its next collective
  std::map<std::int64_t, PendingCollective> pending;
  std::map<std::pair<int, int>, Channel> channels;  // (sender, receiver)
  std::deque<ReadyOp> ready;                        // complete operations, in completion order
  bool draining = false;                            // a thread is moving this group's data
  std::vector<Clock::time_point> last_fire;         // per member, latest timer completion
};

}  // namespace

struct SimWorld::Impl {
  Impl(int world_size_, SimOptions options_, std::shared_ptr<CollectiveRecorder> recorder_)
      : world_size(world_size_), options(std::move(options_)), recorder(std::move(recorder_)) {
    if (world_size < 1) {
      throw std::invalid_argument("SimWorld: world_size must be >= 1, got " + std::to_string(world_size));
    }
    for (const auto& [kind, delay] : options.delay) {
      if (delay.count() < 0) {
        throw std::invalid_argument(std::string("SimWorld: negative delay for ") + collective_name(kind));
      }
      if (delay.count() > 0) timer_mode = true;
    }
    if (!recorder) recorder = std::make_shared<CollectiveRecorder>();
    if (timer_mode) timer_thread = std::thread([this] { timer_loop(); });
  }

  const int world_size;
  const SimOptions options;
  std::shared_ptr<CollectiveRecorder> recorder;
  bool timer_mode = false;

  std::mutex mutex;  // the rendezvous state of every group
  std::map<std::pair<std::string, std::vector<int>>, std::unique_ptr<GroupState>> groups;

  std::mutex timer_mutex;
  std::condition_variable timer_wake;
  std::map<std::pair<Clock::time_point, std::uint64_t>, Completion> timer_queue;  // (when, FIFO order)
  std::uint64_t timer_order = 0;
  bool stopping = false;  // the SimWorld is being destroyed: drain, then stop
  bool closed = false;    // the timer thread has stopped: no more completions can be scheduled
  std::thread timer_thread;

  GroupState& group_state(const Group& group) {
    if (group.ranks.empty()) throw std::invalid_argument("SimWorld: group '" + group.axis + "' has no ranks");
    std::set<int> seen;
    for (int r : group.ranks) {
      if (r < 0 || r >= world_size) {
        throw std::invalid_argument("SimWorld: group " + group.describe() + " names rank " + std::to_string(r) +
                                    ", outside world size " + std::to_string(world_size));
      }
      if (!seen.insert(r).second) {
        throw std::invalid_argument("SimWorld: group " + group.describe() + " repeats rank " + std::to_string(r));
      }
    }
    std::lock_guard lock(mutex);
    auto& slot = groups[{group.axis, group.ranks}];
    if (!slot) slot = std::make_unique<GroupState>(group);
    return *slot;
  }

  std::chrono::microseconds delay_of(CollectiveKind kind) const {
    auto it = options.delay.find(kind);
    return it == options.delay.end() ? std::chrono::microseconds(0) : it->second;
  }

  void post_collective(GroupState& g, Post post) {
    bool complete = false;
    {
      std::lock_guard lock(mutex);
      const auto member = static_cast<std::size_t>(post.member);
      const std::int64_t op_number = g.next_op[member];
      auto it = g.pending.find(op_number);
      if (it != g.pending.end()) {
        for (const auto& other : it->second.posts) {
          if (other) check_collective_match(g.group, op_number, post, *other);
        }
      } else {
        it = g.pending.emplace(op_number, PendingCollective{}).first;
        it->second.posts.resize(g.group.ranks.size());
      }
      PendingCollective& pending = it->second;
      pending.posts[member] = std::move(post);
      ++pending.posted;
      ++g.next_op[member];
      if (pending.posted == g.group.size()) {
        ReadyOp op;
        op.ready = Clock::now();
        for (auto& p : pending.posts) op.posts.push_back(std::move(*p));
        g.pending.erase(it);
        g.ready.push_back(std::move(op));
        complete = true;
      }
    }
    if (complete) drain(g);
  }

  void post_point_to_point(GroupState& g, Post post) {
    const bool is_send = post.kind == CollectiveKind::send;
    const int sender = is_send ? post.member : post.peer;
    const int receiver = is_send ? post.peer : post.member;
    bool complete = false;
    {
      std::lock_guard lock(mutex);
      Channel& channel = g.channels[{sender, receiver}];
      std::deque<Post>& mine = is_send ? channel.sends : channel.recvs;
      std::deque<Post>& theirs = is_send ? channel.recvs : channel.sends;
      const std::int64_t number = is_send ? channel.sends_posted : channel.recvs_posted;
      if (!theirs.empty()) {
        const Post& other = theirs.front();
        const Post& send = is_send ? post : other;
        const Post& recv = is_send ? other : post;
        const std::string op = "message #" + std::to_string(number) + " from member " + std::to_string(sender) +
                               " to member " + std::to_string(receiver);
        if (send.dtype != recv.dtype) throw_mismatch(g.group, op, post, other, "dtypes differ");
        if (send.send.numel() != recv.recv.numel()) throw_mismatch(g.group, op, post, other, "sizes differ");
        ReadyOp ready_op;
        ready_op.ready = Clock::now();
        if (is_send) {
          ready_op.posts.push_back(std::move(post));
          ready_op.posts.push_back(std::move(theirs.front()));
        } else {
          ready_op.posts.push_back(std::move(theirs.front()));
          ready_op.posts.push_back(std::move(post));
        }
        theirs.pop_front();
        g.ready.push_back(std::move(ready_op));
        complete = true;
      } else {
        mine.push_back(std::move(post));
      }
      ++(is_send ? channel.sends_posted : channel.recvs_posted);
    }
    if (complete) drain(g);
  }

  // Runs the group's ready operations in order. One thread at a time drains a group; a thread
  // that finds another draining leaves its operation to that one, so posting never waits and a
  // completion that posts into its own group does not recurse.
  void drain(GroupState& g) {
    {
      std::lock_guard lock(mutex);
      if (g.draining) return;
      g.draining = true;
    }
    try {
      for (;;) {
        ReadyOp op;
        {
          std::lock_guard lock(mutex);
          if (g.ready.empty()) {
            g.draining = false;
            return;
          }
          op = std::move(g.ready.front());
          g.ready.pop_front();
        }
        move_data(op);
        if (timer_mode) {
          schedule(g, op);
        } else {
          for (Post& p : op.posts) run_completion(p.done);
        }
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      g.draining = false;
      throw;
    }
  }

  // Queues the completions of `op` on the timer thread; per member they never overtake earlier ones.
  void schedule(GroupState& g, ReadyOp& op) {
    std::lock_guard lock(timer_mutex);
    if (closed) throw std::logic_error("sim comm: post through a communicator of a destroyed SimWorld");
    for (Post& p : op.posts) {
      Clock::time_point& last = g.last_fire[static_cast<std::size_t>(p.member)];
      const Clock::time_point when = std::max(op.ready + delay_of(p.kind), last);
      last = when;
      timer_queue.emplace(std::make_pair(when, timer_order++), std::move(p.done));
    }
    timer_wake.notify_one();
  }

  void timer_loop() {
    std::unique_lock lock(timer_mutex);
    for (;;) {
      if (timer_queue.empty()) {
        if (stopping) {
          closed = true;
          return;
        }
        timer_wake.wait(lock);
        continue;
      }
      const Clock::time_point when = timer_queue.begin()->first.first;
      if (Clock::now() < when && !stopping) {  // a world being destroyed fires what is queued at once
        timer_wake.wait_until(lock, when);
        continue;
      }
      auto node = timer_queue.extract(timer_queue.begin());
      lock.unlock();
      run_completion(node.mapped());
      node = {};  // release what the completion captured outside the lock
      lock.lock();
    }
  }

  void shutdown() {
    if (!timer_thread.joinable()) return;
    {
      std::lock_guard lock(timer_mutex);
      stopping = true;
    }
    timer_wake.notify_all();
    timer_thread.join();
  }
};

namespace {

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(std::shared_ptr<SimWorld::Impl> world, GroupState& state, int rank)
      : world_(std::move(world)), state_(state), rank_(rank), member_(state.group.index_of(rank)),
        checks_("sim", state.group, rank) {}

  int rank() const override { return rank_; }
  const Group& group() const override { return state_.group; }

  void all_gather(const Tensor& send, const Tensor& recv, const std::string& tag, Completion done) override {
    checks_.all_gather(send, recv, tag);
    Post p = make_post(CollectiveKind::all_gather, send.dtype(), static_cast<std::int64_t>(send.bytes()), tag,
                       std::move(done));
    p.send = send;
    p.recv = recv;
    world_->post_collective(state_, std::move(p));
  }

  void reduce_scatter(const Tensor& send, const Tensor& recv, const std::string& tag, Completion done) override {
    checks_.reduce_scatter(send, recv, tag);
    Post p = make_post(CollectiveKind::reduce_scatter, send.dtype(), static_cast<std::int64_t>(send.bytes()), tag,
                       std::move(done));
    p.send = send;
    p.recv = recv;
    world_->post_collective(state_, std::move(p));
  }

  void all_reduce(const Tensor& inout, const std::string& tag, Completion done) override {
    checks_.all_reduce(inout, tag);
    Post p = make_post(CollectiveKind::all_reduce, inout.dtype(), static_cast<std::int64_t>(inout.bytes()), tag,
                       std::move(done));
    p.send = inout;
    p.recv = inout;
    world_->post_collective(state_, std::move(p));
  }

  void broadcast(const Tensor& inout, int root, const std::string& tag, Completion done) override {
    checks_.broadcast(inout, root, tag);
    const std::int64_t bytes = root == member_ ? static_cast<std::int64_t>(inout.bytes()) : 0;
    Post p = make_post(CollectiveKind::broadcast, inout.dtype(), bytes, tag, std::move(done));
    p.send = inout;
    p.recv = inout;
    p.root = root;
    world_->post_collective(state_, std::move(p));
  }

  void all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts, const Tensor& recv,
                    const std::vector<std::int64_t>& recv_counts, const std::string& tag, Completion done) override {
    checks_.all_to_all_v(send, send_counts, recv, recv_counts, tag);
    Post p = make_post(CollectiveKind::all_to_all_v, send.dtype(), static_cast<std::int64_t>(send.bytes()), tag,
                       std::move(done));
    p.send = send;
    p.recv = recv;
    p.send_counts = send_counts;
    p.recv_counts = recv_counts;
    world_->post_collective(state_, std::move(p));
  }

  void send(const Tensor& tensor, int peer, const std::string& tag, Completion done) override {
    checks_.point_to_point("send", tensor, peer, tag);
    Post p = make_post(CollectiveKind::send, tensor.dtype(), static_cast<std::int64_t>(tensor.bytes()), tag,
                       std::move(done));
    p.send = tensor;
    p.peer = peer;
    world_->post_point_to_point(state_, std::move(p));
  }

  void recv(const Tensor& tensor, int peer, const std::string& tag, Completion done) override {
    checks_.point_to_point("recv", tensor, peer, tag);
    Post p = make_post(CollectiveKind::recv, tensor.dtype(), 0, tag, std::move(done));
    p.recv = tensor;
    p.peer = peer;
    world_->post_point_to_point(state_, std::move(p));
  }

 private:
  // A post whose completion first appends this rank's record.
  Post make_post(CollectiveKind kind, DType dtype, std::int64_t bytes, const std::string& tag, Completion done) const {
    const std::shared_ptr<CollectiveRecorder>& recorder = world_->recorder;
    Post p;
    p.kind = kind;
    p.dtype = dtype;
    p.member = member_;
    p.rank = rank_;
    p.tag = tag;
    p.done = CollectiveRecorder::finishing(recorder, recorder->posted(kind, state_.group, dtype, bytes, tag, rank_),
                                           std::move(done));
    return p;
  }

  std::shared_ptr<SimWorld::Impl> world_;
  GroupState& state_;  // owned by world_
  int rank_;
  int member_;
  CollectiveChecks checks_;
};

}  // namespace

SimWorld::SimWorld(int world_size, SimOptions options, std::shared_ptr<CollectiveRecorder> recorder)
    : impl_(std::make_shared<Impl>(world_size, std::move(options), std::move(recorder))) {}

SimWorld::~SimWorld() { impl_->shutdown(); }

int SimWorld::world_size() const { return impl_->world_size; }
const std::shared_ptr<CollectiveRecorder>& SimWorld::recorder() const { return impl_->recorder; }

std::unique_ptr<Communicator> SimWorld::communicator(const Group& group, int rank) {
  GroupState& state = impl_->group_state(group);
  return std::make_unique<SimCommunicator>(impl_, state, rank);
}

}  // namespace atl
