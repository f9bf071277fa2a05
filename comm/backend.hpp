// A communication backend: builds the Communicator of a rank in a group, and keeps the collective
// record of the ranks it serves. The runtime asks the backend for every group of its own ranks
// and never sees which backend it is (sim or ucx; nccl later, behind the same interface).
#pragma once
#include <memory>
#include <string>

#include "comm/collective_record.hpp"
#include "comm/communicator.hpp"
#include "kernels/rank_group.hpp"

namespace atl {

class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual std::string name() const = 0;
  virtual int world_size() const = 0;
  // The communicator of global rank `rank` in `group` (rank must be a member).
  virtual std::unique_ptr<Communicator> communicator(const Group& group, int rank) = 0;
  // Every finished collective of the ranks this backend serves (in sim: of the whole job).
  virtual std::shared_ptr<CollectiveRecorder> recorder() const = 0;
};

}  // namespace atl
