// The compute actor of one rank: runs model pieces (kernels) one at a time. It is spawned
// detached, on a thread of its own, so long kernels never hold up the scheduler threads that
// unit and comm actors need to keep gathers moving (that is what lets gathers overlap compute).
#include "actors/spawn.hpp"
#include "actors/supervision.hpp"
#include "kernels/cpu/compute_pool.hpp"

namespace atl {

namespace {

compute_actor::behavior_type compute_behavior(compute_actor::pointer self, int rank,
                                              std::shared_ptr<cpu::ComputePool> pool,
                                              std::shared_ptr<SpanTracer> tracer) {
  exit_with_exception_message(self);
  return {
      [=](run_atom, const ComputeJob& job) -> caf::result<done_atom> {
        cpu::ComputePoolScope scope(pool.get());
        for (const ComputeTask& task : job.tasks) {
          const double start = tracer->now_us();
          try {
            task.work();
          } catch (const std::exception& e) {
            return caf::make_error(caf::sec::runtime_error,
                                   "rank " + std::to_string(rank) + ", " + task.name + ": " + e.what());
          }
          tracer->add({rank, "compute", task.name, "compute", start, tracer->now_us()});
        }
        return done_atom::value;
      },
  };
}

}  // namespace

compute_actor spawn_compute_actor(caf::actor_system& system, int rank, int threads, std::shared_ptr<SpanTracer> tracer) {
  auto pool = threads > 1 ? std::make_shared<cpu::ComputePool>(threads) : nullptr;
  return system.spawn<caf::detached>(compute_behavior, rank, std::move(pool), std::move(tracer));
}

}  // namespace atl
