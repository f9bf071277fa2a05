// The `ucx` backend behind the CommBackend interface: the UcxWorld of this process's ranks, once
// connected to every rank's worker (the rendezvous hands over the addresses).
#pragma once
#include <memory>

#include "comm/backend.hpp"
#include "comm/ucx/ucx_world.hpp"

namespace atl {

class UcxBackend : public CommBackend {
 public:
  explicit UcxBackend(std::shared_ptr<UcxWorld> world) : world_(std::move(world)) {}
  std::string name() const override { return "ucx"; }
  int world_size() const override { return world_->world_size(); }
  std::unique_ptr<Communicator> communicator(const Group& group, int rank) override {
    return world_->communicator(group, rank);
  }
  std::shared_ptr<CollectiveRecorder> recorder() const override { return world_->recorder(); }

 private:
  std::shared_ptr<UcxWorld> world_;
};

}  // namespace atl
