// Communicator: collectives over one process group, asynchronous. A call returns at once; the
// completion runs exactly once when this rank's part is done (on an arbitrary thread: an actor
// turns it into a message to itself). Every member of the group issues the same collectives in
// the same order. Each call carries exactly one dtype; tensors are contiguous CPU tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/rank_group.hpp"
#include "kernels/tensor.hpp"

namespace atl {

enum class CollectiveKind { all_gather, reduce_scatter, all_reduce, broadcast, all_to_all_v, send, recv };
const char* collective_name(CollectiveKind kind);

using Completion = std::function<void()>;

// Runs `post(done)` (a collective, say) and blocks this thread until `done` is called: for callers
// outside the actors (a process's start-up, benchmarks), never on a thread that must run it.
void run_and_wait(const std::function<void(Completion)>& post);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // this member's global rank
  virtual const Group& group() const = 0;
  int group_index() const { return group().index_of(rank()); }

  // `tag` names who asked (an FSDP unit's name, "loss", ...) for the collective record and trace.
  // recv[i*n .. (i+1)*n) = send of group member i; send [n], recv [size*n]. send is apart from
  // recv or exactly this member's block of it (in place).
  virtual void all_gather(const Tensor& send, const Tensor& recv, const std::string& tag, Completion done) = 0;
  // Sum over members of send[size*n]; member i receives block i in recv [n]. recv is apart from
  // send or exactly send's block i (in place).
  virtual void reduce_scatter(const Tensor& send, const Tensor& recv, const std::string& tag, Completion done) = 0;
  // In-place sum over members.
  virtual void all_reduce(const Tensor& inout, const std::string& tag, Completion done) = 0;
  // In-place copy of member `root`'s tensor to every member.
  virtual void broadcast(const Tensor& inout, int root, const std::string& tag, Completion done) = 0;
  // send holds, in member order, send_counts[j] elements for member j; recv receives
  // recv_counts[j] elements from member j, in member order. send and recv do not overlap.
  virtual void all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts, const Tensor& recv,
                            const std::vector<std::int64_t>& recv_counts, const std::string& tag,
                            Completion done) = 0;
  // Point to point with group member `peer` (another member's index; never this member's).
  virtual void send(const Tensor& tensor, int peer, const std::string& tag, Completion done) = 0;
  virtual void recv(const Tensor& tensor, int peer, const std::string& tag, Completion done) = 0;
};

}  // namespace atl
