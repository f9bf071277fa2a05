// Where a run starts (fresh, a checkpoint to resume, or weights to load), and its wire form for a
// multi-process job (issue 11): node 0 alone finds and reads the checkpoint and hands the result
// to the other nodes, so they need no view of checkpoint.dir, never read a checkpoint file, and
// cannot start from a different step than node 0.
#pragma once
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/training/engine.hpp"

namespace atl {

struct StartingPoint {
  TrainingState state;  // empty master: a fresh model
  std::optional<nlohmann::json> data_cursor;
  std::int64_t tokens = 0;  // tokens trained on before the start
  std::string description = "fresh initialisation";
};

// Node 0 could not start (a missing or damaged checkpoint, say); what() says why, from node 0.
class StartFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A JSON header (step, tokens, description, data cursor, each tensor's name and shape) and the
// fp32 tensors' bytes, master then exp_avg then exp_avg_sq.
std::vector<std::byte> encode_starting_point(const StartingPoint& start);
// Node 0's failure, to hand on instead of a starting point.
std::vector<std::byte> encode_start_failure(const std::string& why);
// Whether bytes encode node 0's failure (every node then stops: an end they all agree on).
bool is_start_failure(std::span<const std::byte> bytes);
// Throws StartFailed for an encoded failure, std::invalid_argument for malformed bytes.
StartingPoint decode_starting_point(std::span<const std::byte> bytes);

}  // namespace atl
