// The `ucx` backend's transport (issue 11): one UCX worker per rank of this process, endpoints to
// every rank of the job, and one progress thread that makes every UCX call (so the workers run in
// UCX's single-thread mode and nothing else touches them). Collectives are built from tagged
// point-to-point messages between the group's members, as direct exchanges:
//   all_gather      each member sends its block to every other member;
//   reduce_scatter  member i receives part i of every member's buffer, in 256 KiB chunks through
//                   a few reused staging slots, and sums each chunk as soon as every member's has
//                   arrived (while the next travel) over the fixed pairwise tree of member index
//                   (kernels/tree_sum_arrays.hpp): the sim backend's order, so a UCX run is
//                   bitwise equal to a sim run of the same mesh (and moves the bytes of a ring);
//   all_reduce      a reduce_scatter of equal chunks, then an all_gather of the sums;
//   broadcast       the root sends to every member;
//   all_to_all_v    member i sends send_counts[j] elements to member j;
//   send / recv     FIFO per (sender, receiver) pair.
// A tag is (group id: a hash of the group's description, the group's operation number, the
// sender's member index); every member numbers its group's collectives in the same order, so
// messages never need a rendezvous. Nothing here is a UCX type in the Communicator interface.
//
// Connecting: local_addresses() gives this process's workers' addresses; connect() takes every
// rank's (from the rendezvous) and creates the endpoints. In one process (tests), connect with
// local_addresses(). Endpoints use UCX's peer error handling: a transfer to or from a process
// that died fails without aborting this one; the operation never completes, the failure is
// printed once, and the job's control plane (comm/rendezvous/control_plane.hpp), which sees the
// process go, stops this process naming the lost node.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "comm/collective_record.hpp"
#include "comm/communicator.hpp"
#include "kernels/rank_group.hpp"

namespace atl {

using WorkerAddress = std::vector<std::byte>;

enum class TransferFailure { broken, disagreement };

// The format of this backend's messages (tags, chunk sizes, the order of a collective's
// transfers): nodes must use the same one. Raise it with any change to them.
constexpr int kUcxWireVersion = 1;

class UcxWorld {
 public:
  // Workers for `local_ranks` (ranks of a `world_size`-rank job). Throws std::runtime_error when
  // UCX cannot start.
  // `peer_errors`: UCX's peer error handling (a dead peer fails transfers; the control plane then
  // names it). UCX 1.13 supports it over network transports only (tcp on one machine), so without
  // it a single machine gets shared memory, ~2-4x the bandwidth, and a dead peer aborts the
  // survivors inside UCX (they still exit non-zero).
  UcxWorld(int world_size, std::vector<int> local_ranks, std::shared_ptr<CollectiveRecorder> recorder = nullptr,
           bool peer_errors = true);
  ~UcxWorld();
  UcxWorld(const UcxWorld&) = delete;
  UcxWorld& operator=(const UcxWorld&) = delete;

  int world_size() const;
  const std::shared_ptr<CollectiveRecorder>& recorder() const;

  std::map<int, WorkerAddress> local_addresses() const;
  // Every rank's worker address; call once, before any communicator is used.
  void connect(const std::map<int, WorkerAddress>& addresses);
  // These remote ranks' process has finished the job (it said goodbye): their endpoints breaking
  // is its end, not a failure, and goes unreported; nothing more is flushed to them. Any thread.
  void said_goodbye(const std::vector<int>& remote_ranks);
  // These remote ranks may end from now on (this process is ending the job): their endpoints
  // breaking goes unreported, but what this process sent them is still flushed at its end. Any thread.
  void expect_end(const std::vector<int>& remote_ranks);
  // After the first transfer failure (not of a peer whose end is expected), `action` runs on a
  // thread of its own once `grace` has passed, unless the process ended first: a failed transfer
  // never completes its operation, and with both processes alive nothing else would end the job.
  // Its argument: a broken transfer (atoll-train exits 1, a restart may help) or processes that
  // disagree about a collective (exit 2: they run different builds or plans). Call before the
  // transfers start.
  void on_transfer_failure(std::chrono::milliseconds grace, std::function<void(TransferFailure)> action);
  // What this world's own messages on stderr start with ("[node 1] "): nodes share a terminal.
  void set_message_prefix(std::string prefix);
  // How messages name a remote rank ("rank 3 (node 1)"; default "rank 3").
  void name_ranks(std::function<std::string(int rank)> name);

  // The communicator of local rank `rank` in `group` (std::invalid_argument when it is not a
  // member or not local).
  std::unique_ptr<Communicator> communicator(const Group& group, int rank);

  struct Impl;  // ucx_world.cpp

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace atl
