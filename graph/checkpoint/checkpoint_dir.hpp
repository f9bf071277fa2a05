// Training checkpoints: one directory per step under a root,
//   root/step-00000010/ model.safetensors (or HF shards + index), optimizer.safetensors
//                       (exp_avg.<name>, exp_avg_sq.<name>), trainer_state.json, config.json, COMPLETE
// A save writes everything into root/.tmp-step-00000010-<pid>, COMPLETE last, then renames the
// directory into place, so a save killed at any point leaves every earlier checkpoint loadable.
// A root has one writer at a time (a save removes the .tmp-step-, .tmp-replaced-step- and
// .tmp-retired-step- directories it finds there; nothing else, so an import may share a folder).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/param.hpp"

namespace atl {

struct CheckpointContents {
  std::int64_t step = 0;
  TensorMap model;       // native layout, fp32 masters
  TensorMap exp_avg;     // AdamW moments: same names and shapes as model
  TensorMap exp_avg_sq;
  nlohmann::json trainer_state;  // object: step, data cursor, seeds, config; "step" always equals `step`
  nlohmann::json model_config;   // written as config.json (an object; null writes {})
};

// Model shards are at most this big (2 GiB).
inline constexpr std::int64_t kCheckpointShardBytes = std::int64_t{2} << 30;

// `dir` without "." parts or a trailing slash ("out/" -> "out"): its filename() names it.
std::filesystem::path normalised_directory(const std::filesystem::path& dir);

// "step-00000010".
std::string checkpoint_dir_name(std::int64_t step);

// Saves `contents` as root/step-XXXXXXXX (replacing an existing one: it is renamed aside, then removed)
// and returns that path. Then removes stale .tmp-* directories and, when keep > 0, the complete
// checkpoints beyond `keep`: the one just saved stays, with the keep-1 highest-step others. Step 0
// (an import) is neither counted nor removed.
// Checkpoints of later steps stay (a run resumed from an earlier step sets them aside first).
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const CheckpointContents& contents, int keep);

// The complete checkpoints under root of steps above `step`, by step ascending: the timeline a run
// resumed from `step` leaves behind (a bare --resume must not pick them).
std::vector<std::filesystem::path> checkpoints_after(const std::filesystem::path& root, std::int64_t step);
// Removes those; returns their paths.
std::vector<std::filesystem::path> retire_checkpoints_after(const std::filesystem::path& root, std::int64_t step);
// Moves those into `aside` (created; a name that is no step, so no --resume picks them, on the
// same file system: a rename each) and returns their new paths.
std::vector<std::filesystem::path> set_aside_checkpoints_after(const std::filesystem::path& root, std::int64_t step,
                                                               const std::filesystem::path& aside);

// Complete checkpoint directories (step-* holding COMPLETE) under root, by step ascending.
std::vector<std::filesystem::path> complete_checkpoints(const std::filesystem::path& root);

// The complete checkpoint with the highest step; nullopt when there is none (or no root).
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

// The saved checkpoint (a directory holding COMPLETE and trainer_state.json) that `path` is, or
// lies inside, after resolving links and "..": nullopt when none. Nothing may be written there: a
// checkpoint holds exactly the files its manifest lists, and a load refuses any other.
std::optional<std::filesystem::path> enclosing_checkpoint(const std::filesystem::path& path);
// "is or lies inside the saved checkpoint <checkpoint>, which could then not be loaded ...": the
// problem every writer names when enclosing_checkpoint finds one.
std::string inside_checkpoint_problem(const std::filesystem::path& checkpoint);
// CheckpointError("<path>: <what> is or lies inside the saved checkpoint ...") when
// enclosing_checkpoint finds one; `what` says what ("the export", "the import").
void refuse_inside_checkpoint(const std::filesystem::path& path, const std::string& what);

// CheckpointError unless `dir` is a directory holding COMPLETE (a finished save). A checkpoint
// root given instead of one of its step folders is named as such, with its latest checkpoint.
void require_complete_checkpoint(const std::filesystem::path& dir);

// CheckpointError("<file>: <what> holds NaN at element i: refused (<hint>)") unless every value of
// an f32 or bf16 tensor is finite (and >= 0 with non_negative: a second moment); other dtypes pass.
void check_tensor_values(const std::filesystem::path& file, const std::string& what, const Tensor& t, bool non_negative,
                         const char* hint);
// The hint of a refusal by a writer (a save, an import): what it would write could not be loaded.
inline constexpr const char* kNeverSavedHint = "a checkpoint is never written with values a load would refuse";

struct CheckpointLoadOptions {
  // Accept NaN / inf in weights and moments (atoll-eval --allow-nonfinite, to inspect a broken run).
  bool allow_nonfinite = false;
};

// Loads and validates a checkpoint directory: COMPLETE present and its manifest matching every
// file (manifest.hpp), every file parses, optimizer tensors match the model's names and shapes,
// trainer_state.json's step matches the directory name, weights and moments are finite and every
// exp_avg_sq is >= 0. model is sorted by name (as read_model_files returns it); exp_avg and
// exp_avg_sq follow model's order.
CheckpointContents load_checkpoint(const std::filesystem::path& dir, const CheckpointLoadOptions& options = {});

}  // namespace atl
