// exit_code_for: the exit codes docs/failures.md promises, by what ended a run.
#include <catch2/catch.hpp>

#include <new>
#include <stdexcept>

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/durable_file.hpp"
#include "graph/config_reader.hpp"
#include "graph/data/data_source.hpp"
#include "graph/training/exit_code.hpp"
#include "graph/training/run.hpp"
#include "graph/training/starting_point.hpp"
#include "kernels/cpu/cpu_features.hpp"

namespace atl {

TEST_CASE("exit_code_for maps what ended a run to the documented exit code", "[run]") {
  CHECK(exit_code_for(RunFinished("nothing to do")) == 0);
  CHECK(exit_code_for(RunStopped(15, "stopped")) == 143);
  CHECK(exit_code_for(RunStopped(2, "stopped")) == 130);
  CHECK(exit_code_for(NonFiniteError("loss")) == 3);
  CHECK(exit_code_for(DivergedWeights("weights")) == 3);
  CHECK(exit_code_for(ConfigError("run.yaml", "train.steps", "a positive integer")) == 2);
  CHECK(exit_code_for(CheckpointError("damaged")) == 2);
  CHECK(exit_code_for(DataError("no tokens")) == 2);
  CHECK(exit_code_for(cpu::CpuIsaError("ATOLL_CPU_ISA")) == 2);
  CHECK(exit_code_for(StartFailed("node 0 says", 2)) == 2);
  CHECK(exit_code_for(StartFailed("node 0 says", 0)) == 0);
  CHECK(exit_code_for(FileWriteError("no space")) == 1);  // not bad input: a restart may mend it
  CHECK(exit_code_for(std::bad_alloc()) == 1);
  CHECK(exit_code_for(std::runtime_error("a lost node")) == 1);
}

}  // namespace atl
