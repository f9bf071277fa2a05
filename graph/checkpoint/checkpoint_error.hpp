// The one exception type of the checkpoint layer: a file that cannot be read, written or trusted.
// Messages start with the file (or directory) they are about, then say what is wrong.
#pragma once
#include <stdexcept>

namespace atl {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// save_checkpoint was handed values a load would refuse (NaN, an infinity, a negative second
// moment): a diverged run, not a bad file. Nothing was written.
class UnsavableState : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

}  // namespace atl
