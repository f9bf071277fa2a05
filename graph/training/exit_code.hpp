// The exit code a run ends with, by what ended it (docs/failures.md): one mapping for atoll-train
// and for node 0's hand-over of a failed start, whose code every node of a job exits with.
#pragma once
#include <exception>

namespace atl {

// 0 nothing left to do (RunFinished); 2 bad input (ConfigError, CheckpointError, DataError,
// CpuIsaError); 3 non-finite training; 128 + signal for a stop asked for by a signal; node 0's code
// for StartFailed; 1 anything else (FileWriteError, out of memory, a lost node).
int exit_code_for(const std::exception& e);

}  // namespace atl
