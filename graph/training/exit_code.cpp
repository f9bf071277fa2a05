#include "graph/training/exit_code.hpp"

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/config_reader.hpp"
#include "graph/data/data_source.hpp"
#include "graph/training/run.hpp"
#include "graph/training/starting_point.hpp"
#include "kernels/cpu/cpu_features.hpp"

namespace atl {

int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const RunFinished*>(&e)) return 0;
  if (const auto* stopped = dynamic_cast<const RunStopped*>(&e)) return 128 + stopped->signal();
  if (dynamic_cast<const NonFiniteError*>(&e)) return 3;
  if (const auto* start = dynamic_cast<const StartFailed*>(&e)) return start->exit_code();
  if (dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const CheckpointError*>(&e) ||
      dynamic_cast<const DataError*>(&e) || dynamic_cast<const cpu::CpuIsaError*>(&e)) {
    return 2;
  }
  return 1;
}

}  // namespace atl
