// The actor runtime behind atoll-train: executes a Plan with CAF actors — per rank a stage, a
// compute actor, one unit actor per FSDP unit and one comm actor; per process a trainer. An
// engine spawns only the ranks of its process and reaches the others only through the comm
// backend (in `sim`, one process runs every rank). This header keeps CAF out of its includers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/collective_record.hpp"
#include "graph/plan/plan.hpp"
#include "graph/plan/step_program.hpp"
#include "graph/training/run.hpp"

namespace atl {

struct Span;
class CommBackend;

// The ranks one process runs and the backend their collectives go through. Defaults: every rank
// of the mesh, on a fresh backend of the config's kind. Two engines given the same sim backend
// and complementary ranks behave as two processes of one job: they share nothing but the backend.
struct ProcessOptions {
  std::vector<int> ranks;
  std::shared_ptr<CommBackend> backend;
};

class ActorEngine : public TrainingEngine {
 public:
  // Plans the model on the config's mesh (ConfigError when the mesh or batch cannot run) and
  // spawns the actors of this process's ranks.
  explicit ActorEngine(EngineInputs inputs, ProcessOptions process = {});
  ~ActorEngine() override;
  ActorEngine(const ActorEngine&) = delete;
  ActorEngine& operator=(const ActorEngine&) = delete;

  const char* name() const override { return "actors"; }
  // The blocks of this process's data-parallel ranks.
  std::vector<RowRange> rows_read(std::int64_t global_rows) const override;
  StepResult step(const Batch& rows, bool record_routing = false) override;
  bool agrees_on_stop() const override { return true; }
  void request_stop(int signal) override;
  // The whole model and optimizer state, all-gathered through collectives over every shard group
  // (so every process of a job must call it, as with step()).
  TrainingState state() const override;
  std::optional<std::string> chrome_trace() const override;

  const Plan& plan() const;
  // The step program every rank runs (train.schedule, the config's micro-batches per rank).
  const StepProgram& program() const;
  // Mean wall time of a unit gather requested through the trainer and every rank's stage
  // (request, all-gather through the comm actors, params back, reshard), between steps. For bench/.
  double gather_round_trip_us(std::size_t unit, int iterations);
  // Every collective's record so far, when the backend's recorder keeps them (tests; an engine
  // making its own backend: EngineInputs::keep_collective_records), else none.
  std::vector<CollectiveRecord> collective_records() const;
  std::vector<Span> spans() const;  // empty unless EngineInputs::trace

 private:
  // Spawns every rank's actors and the trainer (the constructor abandons the system if it throws).
  void spawn_actors(const EngineInputs& in, const Plan& plan, const Mesh& mesh, int threads_per_rank);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<TrainingEngine> make_actor_engine(EngineInputs inputs);

}  // namespace atl
