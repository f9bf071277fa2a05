// The sim backend behind the CommBackend interface: one SimWorld shared by every engine of the
// job that lives in this process (a test can run two "processes" as two engines on one world).
#pragma once
#include <memory>

#include "comm/backend.hpp"
#include "comm/sim/sim_world.hpp"

namespace atl {

class SimBackend : public CommBackend {
 public:
  explicit SimBackend(int world_size, SimOptions options = {}, std::shared_ptr<CollectiveRecorder> recorder = nullptr)
      : world_(std::make_shared<SimWorld>(world_size, std::move(options), std::move(recorder))) {}
  std::string name() const override { return "sim"; }
  int world_size() const override { return world_->world_size(); }
  std::unique_ptr<Communicator> communicator(const Group& group, int rank) override {
    return world_->communicator(group, rank);
  }
  std::shared_ptr<CollectiveRecorder> recorder() const override { return world_->recorder(); }

 private:
  std::shared_ptr<SimWorld> world_;
};

}  // namespace atl
