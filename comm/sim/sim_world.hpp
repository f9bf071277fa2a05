// The in-process `sim` backend: one SimWorld simulates every rank of a job; each rank (on any
// thread) gets a Communicator per group it belongs to.
//
// Rendezvous: for each group (axis + ranks) every member counts the collectives it posts; op #n
// of the group runs when all members have posted op #n. All members must post the same kind and
// dtype with compatible sizes; otherwise the post that detects the mismatch throws
// std::logic_error naming the group, the op number, both tags and both calls (the offending post
// is not registered). Local misuse (wrong shapes, a non-f32 reduction, a bad root or peer) throws
// std::invalid_argument from the post. send/recv pair by (group, sender, receiver) in FIFO order.
//
// Data moves once the last member has posted, on that member's thread, outside every lock.
// Reductions sum f32 over members in the fixed pairwise tree of member index
// (kernels/tree_sum.hpp), so results do not depend on posting order. `broadcast`'s root and the
// peers of send/recv are group member indices.
//
// Completions. Without injected delays (SimOptions::delay empty or all zero) they fire
// synchronously on the thread that runs the group's data movement: the last member to post, or a
// thread already draining that group, never nested inside a completion of the same group (so a
// completion may post the next collective at once, and long chains do not grow the stack). With
// any delay configured, every completion goes through the SimWorld's timer thread and fires no
// earlier than delay[kind] after the last member posted (zero for kinds not listed); posting
// never sleeps. In both modes one member's completions within one group fire in the order its
// operations completed (collectives complete in issue order). Completions must not throw (the
// process aborts) and should not block.
//
// Every finished operation appends one CollectiveRecord per member to the recorder. The
// destructor fires all timer completions still queued at once, without waiting out their delays
// (including ones they cause), and joins the timer thread; operations still waiting for members
// are dropped. Communicators may outlive the SimWorld, but posting through them afterwards in
// delay mode throws std::logic_error.
#pragma once
#include <chrono>
#include <map>
#include <memory>

#include "comm/collective_record.hpp"
#include "comm/communicator.hpp"
#include "kernels/rank_group.hpp"

namespace atl {

struct SimOptions {
  std::map<CollectiveKind, std::chrono::microseconds> delay;  // injected latency per kind
};

class SimWorld {
 public:
  // A null recorder makes the world create its own.
  explicit SimWorld(int world_size, SimOptions options = {}, std::shared_ptr<CollectiveRecorder> recorder = nullptr);
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  int world_size() const;
  const std::shared_ptr<CollectiveRecorder>& recorder() const;

  // The communicator of global rank `rank` in `group`. Throws std::invalid_argument when the
  // group is empty, repeats a rank or names a rank outside [0, world_size), or when `rank` is not
  // a member.
  std::unique_ptr<Communicator> communicator(const Group& group, int rank);

  struct Impl;  // defined in sim_world.cpp (public only so the communicator there can name it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace atl
