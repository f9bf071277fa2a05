// Where a run starts (fresh, a checkpoint to resume, or weights to load), and its wire form for a
// multi-process job (issue 11): node 0 alone finds and reads the checkpoint and hands the result
// to the other nodes, so they need no view of checkpoint.dir, never read a checkpoint file, and
// cannot start from a different step than node 0.
#pragma once
#include <cstddef>
#include <functional>
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
  // Node 0's alone (not handed over): whether it continues the run kept in run_dir and
  // checkpoint.dir (a checkpoint of checkpoint.dir, not an import), and the settings that differ
  // from the checkpoint's run ("train.steps 300 -> 400"; empty when none).
  bool resumed = false;
  std::string changed_settings;
  // Node 0's alone: how the config's model differs from that of the checkpoint whose weights it
  // starts from (checkpoint.load, or an import), in settings that keep the shapes
  // ("rope_theta 10000.0 -> 500000.0"; empty when none). Allowed (fine-tuning may change them), named.
  std::string model_changes;
  // Node 0's alone: the checkpoint a run that does not continue checkpoint.dir's began from
  // (another run's, one set aside, or an import; absolute), else "". run.json records it, so a
  // restart before the first save begins there again instead of from a fresh model.
  std::string began_from;
};

// Node 0 did not start (a missing or damaged checkpoint, say, or a run already finished); what()
// says why, from node 0. exit_code: node 0's (2 bad input: config, checkpoint, data; 0 nothing to
// do; 1 otherwise), which every node exits with, so a launcher reads the job's end alike from any
// node (a refusal is not a failure a restart could mend).
class StartFailed : public std::runtime_error {
 public:
  StartFailed(const std::string& what, int exit_code) : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// How node 0 hands its starting point to the other nodes of a multi-process job (the app wires
// each to collectives among the nodes; every node makes every call, in the same order). The
// header travels as bytes, then each tensor straight into its place (no copy in transit).
struct StartHandOver {
  // Node 0's bytes to every node (node 0 passes them, the others anything) and back.
  std::function<std::vector<std::byte>(std::vector<std::byte>)> bytes;
  // Node 0's tensor into every other node's tensor of the same shape.
  std::function<void(const Tensor&)> tensor;
  // Returns once every node holds everything sent: node 0 may then stop without losing any of it.
  std::function<void()> barrier;
};

// The header: step, tokens, description, data cursor, each fp32 tensor's name and shape (master,
// then exp_avg, then exp_avg_sq).
std::vector<std::byte> encode_start_header(const StartingPoint& start);
// Node 0's failure, to hand on instead of a header.
std::vector<std::byte> encode_start_failure(const std::string& why, int exit_code);
// Whether bytes encode node 0's failure (every node then stops: an end they all agree on).
bool is_start_failure(std::span<const std::byte> bytes);
// The header's starting point with uninitialised tensors of its shapes, to receive into. Throws
// StartFailed for an encoded failure, std::invalid_argument for malformed bytes.
StartingPoint decode_start_header(std::span<const std::byte> bytes);
// Every tensor of a starting point in the header's order (handles: filling one fills the state).
std::vector<Tensor> start_tensors(const StartingPoint& start);

}  // namespace atl
