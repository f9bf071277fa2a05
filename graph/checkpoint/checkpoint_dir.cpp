#include "graph/checkpoint/checkpoint_dir.hpp"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)

#include <algorithm>
#include <cmath>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/core.h>

#include "graph/checkpoint/durable_file.hpp"
#include "graph/checkpoint/json_file.hpp"
#include "graph/checkpoint/manifest.hpp"
#include "graph/checkpoint/safetensors.hpp"

namespace atl {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kComplete = "COMPLETE";
constexpr std::string_view kOptimizerFile = "optimizer.safetensors";
constexpr std::string_view kTrainerStateFile = "trainer_state.json";
constexpr std::string_view kConfigFile = "config.json";
constexpr std::string_view kTemporaryPrefix = ".tmp-";
constexpr std::string_view kExpAvgPrefix = "exp_avg.";
constexpr std::string_view kExpAvgSqPrefix = "exp_avg_sq.";
constexpr const char* kInspectHint = "atoll-eval --allow-nonfinite loads it for inspection";

[[noreturn]] void fail(const fs::path& file, const std::string& fault) {
  throw CheckpointError(fmt::format("{}: {}", file.string(), fault));
}

// The step of a "step-<digits>" name.
std::optional<std::int64_t> parse_step_dir_name(const std::string& name) {
  constexpr std::string_view prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 || name.rfind(prefix, 0) != 0) {
    return std::nullopt;
  }
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Removal that is atomic as far as readers go: rename under a .tmp- name first, so a crash in the
// middle of remove_all leaves a stale .tmp- directory (cleaned later), never a half checkpoint.
void retire_directory(const fs::path& root, const fs::path& dir) {
  fs::path aside = root / fmt::format("{}retired-{}-{}", kTemporaryPrefix, dir.filename().string(), temporary_tag());
  fs::remove_all(aside);
  fs::rename(dir, aside);
  fs::remove_all(aside);
}

// The moments against the weights (the model files): `file` names the moments, but either side may
// be the damaged one, so the messages say both.
void check_optimizer_matches(const fs::path& file, const TensorMap& model, const TensorMap& moments,
                             std::string_view prefix) {
  constexpr std::string_view kEither = "(one of the two files is damaged or from another save)";
  for (const auto& name : model.names()) {
    if (!moments.contains(name)) {
      fail(file, fmt::format("no {}{} for the model files' parameter '{}' {}", prefix, name, name, kEither));
    }
    const Tensor& m = moments.at(name);
    const Tensor& p = model.at(name);
    if (m.shape() != p.shape()) {
      fail(file, fmt::format("{}{} has shape {} but the model files' parameter '{}' has shape {} {}", prefix, name,
                             shape_string(m.shape()), name, shape_string(p.shape()), kEither));
    }
  }
  for (const auto& name : moments.names()) {
    if (!model.contains(name)) {
      fail(file, fmt::format("{}{} has no parameter '{}' in the model files {}", prefix, name, name, kEither));
    }
  }
}

}  // namespace

void check_tensor_values(const fs::path& file, const std::string& what, const Tensor& t, bool non_negative,
                         const char* hint) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::bf16) return;
  const Tensor values = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  const float* v = values.data<float>();
  for (std::int64_t i = 0; i < values.numel(); ++i) {
    if (!std::isfinite(v[i])) {
      fail(file, fmt::format("{} holds {} at element {}: refused ({})", what, std::isnan(v[i]) ? "NaN" : "an infinity",
                             i, hint));
    }
    if (non_negative && v[i] < 0.0f) {
      fail(file, fmt::format("{} holds {} at element {}, but a second moment is a mean of squares (>= 0)", what,
                             v[i], i));
    }
  }
}

namespace {

// Every value of the weights and moments a load takes: finite, second moments >= 0 (the weights'
// messages name `weights_file`, the moments' `moments_file`).
void check_state_values(const fs::path& weights_file, const fs::path& moments_file, const TensorMap& model,
                        const TensorMap& exp_avg, const TensorMap& exp_avg_sq, const char* hint) {
  for (const auto& n : model.names()) {
    check_tensor_values(weights_file, "weight '" + n + "'", model.at(n), false, hint);
    check_tensor_values(moments_file, std::string(kExpAvgPrefix) + n, exp_avg.at(n), false, hint);
    check_tensor_values(moments_file, std::string(kExpAvgSqPrefix) + n, exp_avg_sq.at(n), true, hint);
  }
}

}  // namespace

fs::path normalised_directory(const fs::path& dir) {
  fs::path d = dir.lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  return d;
}

std::string checkpoint_dir_name(std::int64_t step) { return fmt::format("step-{:08d}", step); }

std::optional<fs::path> enclosing_checkpoint(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) return std::nullopt;  // (unresolvable: the writer's own checks name it)
  for (;; p = p.parent_path()) {
    // COMPLETE beside trainer_state.json: a save's marker, not a pipeline's "done" file of that name.
    if (fs::is_regular_file(p / kComplete, ec) && fs::is_regular_file(p / kTrainerStateFile, ec)) return p;
    if (!p.has_relative_path()) return std::nullopt;  // the root: nothing above
  }
}

std::string inside_checkpoint_problem(const fs::path& checkpoint) {
  return "is or lies inside the saved checkpoint " + checkpoint.string() +
         ", which could then not be loaded (a checkpoint holds exactly the files its manifest lists); expected a "
         "path outside it";
}

void refuse_inside_checkpoint(const fs::path& path, const std::string& what) {
  if (const auto checkpoint = enclosing_checkpoint(path)) {
    fail(path, what + " " + inside_checkpoint_problem(*checkpoint));
  }
}

fs::path save_checkpoint(const fs::path& root, const CheckpointContents& contents, int keep) {
  const std::string name = checkpoint_dir_name(contents.step);
  const fs::path final_dir = root / name;
  refuse_inside_checkpoint(root, "the checkpoint");
  if (contents.step < 0) fail(final_dir, fmt::format("step must be non-negative, got {}", contents.step));
  check_optimizer_matches(final_dir, contents.model, contents.exp_avg, kExpAvgPrefix);
  check_optimizer_matches(final_dir, contents.model, contents.exp_avg_sq, kExpAvgSqPrefix);
  // Never write what a load would refuse.
  try {
    check_state_values(final_dir, final_dir, contents.model, contents.exp_avg, contents.exp_avg_sq, kNeverSavedHint);
  } catch (const CheckpointError& e) {
    throw UnsavableState(e.what());
  }
  json trainer_state = contents.trainer_state.is_null() ? json::object() : contents.trainer_state;
  if (!trainer_state.is_object()) fail(final_dir, "trainer_state must be a JSON object");
  if (auto it = trainer_state.find("step"); it != trainer_state.end() && *it != json(contents.step)) {
    fail(final_dir, fmt::format("trainer_state step {} differs from the checkpoint step {}", it->dump(), contents.step));
  }
  trainer_state["step"] = contents.step;
  json config = contents.model_config.is_null() ? json::object() : contents.model_config;
  if (!config.is_object()) fail(final_dir, "model_config (config.json) must be a JSON object");

  create_directories_durably(root);  // a new root (and its new parents) survives a crash
  const fs::path temporary = root / fmt::format("{}{}-{}", kTemporaryPrefix, name, temporary_tag());
  fs::remove_all(temporary);
  fs::create_directory(temporary);
  try {
    write_sharded_safetensors(temporary, contents.model, kCheckpointShardBytes);
    TensorMap moments;
    for (const auto& n : contents.model.names()) moments.insert(std::string(kExpAvgPrefix) + n, contents.exp_avg.at(n));
    for (const auto& n : contents.model.names()) {
      moments.insert(std::string(kExpAvgSqPrefix) + n, contents.exp_avg_sq.at(n));
    }
    write_safetensors(temporary / kOptimizerFile, moments);
    write_file_durably(temporary / kTrainerStateFile, trainer_state.dump(2) + "\n");
    write_file_durably(temporary / kConfigFile, config.dump(2) + "\n");
    // Last: its presence says every other file is complete and durable; it lists their sizes
    // and checksums, verified on load.
    write_file_durably(temporary / kComplete,
                       make_manifest(temporary, contents.step, std::string(kComplete)).dump(2) + "\n");
    fsync_directory(temporary);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temporary, ignored);
    throw;
  }

  // Replacing: the new directory and the old one swap names in one step (the .tmp- name then holds
  // the old one, never taken for a checkpoint again), so a crash leaves one of them under the
  // step's name. Where the filesystem cannot swap, the old one moves aside first, then the new
  // one takes its name: a crash between the two leaves the step's name free.
  std::optional<fs::path> replaced;
  if (fs::exists(fs::symlink_status(final_dir))) {
    if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      replaced = temporary;
    } else {  // (a real fault, not the missing swap, fails the renames below and is named there)
      replaced = root / fmt::format("{}replaced-{}-{}", kTemporaryPrefix, name, temporary_tag());
      fs::remove_all(*replaced);
      fs::rename(final_dir, *replaced);
    }
  }
  if (!replaced || *replaced != temporary) fs::rename(temporary, final_dir);
  fsync_directory(root);
  if (replaced) fs::remove_all(*replaced);

  // Stale temporaries: saves that died (any process), replaced or retired directories; only these
  // (.tmp-step-, .tmp-replaced-step-, .tmp-retired-step-): an import may go into a folder that
  // holds other things.
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const auto ours = [&](const char* kind) { return name.starts_with(std::string(kTemporaryPrefix) + kind + "step-"); };
    if (entry.is_directory() && (ours("") || ours("replaced-") || ours("retired-"))) stale.push_back(entry.path());
  }
  for (const auto& dir : stale) fs::remove_all(dir);

  // Step 0 is an import (atoll-convert), weights a run starts from, not a step of its timeline:
  // keep never counts or removes it.
  std::vector<fs::path> others;
  for (const auto& dir : checkpoints_after(root, 0)) {
    if (dir.filename() != final_dir.filename()) others.push_back(dir);
  }
  if (keep > 0) {
    // Ascending by step: the oldest come first; the newest keep-1 stay.
    std::size_t stay = static_cast<std::size_t>(keep - 1);
    if (others.size() > stay) {
      for (std::size_t i = 0; i < others.size() - stay; ++i) retire_directory(root, others[i]);
    }
  }
  fsync_directory(root);
  return final_dir;
}

std::vector<fs::path> checkpoints_after(const fs::path& root, std::int64_t step) {
  std::vector<fs::path> later;
  for (const auto& dir : complete_checkpoints(root)) {
    if (parse_step_dir_name(dir.filename().string()).value_or(0) > step) later.push_back(dir);
  }
  return later;
}

std::vector<fs::path> retire_checkpoints_after(const fs::path& root, std::int64_t step) {
  const std::vector<fs::path> later = checkpoints_after(root, step);
  for (const auto& dir : later) retire_directory(root, dir);
  if (!later.empty()) fsync_directory(root);
  return later;
}

std::vector<fs::path> set_aside_checkpoints_after(const fs::path& root, std::int64_t step, const fs::path& aside) {
  const std::vector<fs::path> later = checkpoints_after(root, step);
  if (later.empty()) return {};
  fs::create_directories(aside);
  std::vector<fs::path> moved;
  for (const auto& dir : later) {
    moved.push_back(aside / dir.filename());
    fs::rename(dir, moved.back());
  }
  fsync_directory(aside);
  fsync_directory(root);
  return moved;
}

std::vector<fs::path> complete_checkpoints(const fs::path& root) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root)) {
    auto step = parse_step_dir_name(entry.path().filename().string());
    if (step && entry.is_directory() && fs::is_regular_file(entry.path() / kComplete)) {
      found.emplace_back(*step, entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> dirs;
  for (auto& [step, dir] : found) dirs.push_back(std::move(dir));
  return dirs;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  auto dirs = complete_checkpoints(root);
  if (dirs.empty()) return std::nullopt;
  return dirs.back();
}

void require_complete_checkpoint(const fs::path& dir_in) {
  const fs::path dir = normalised_directory(dir_in);
  if (!fs::is_directory(dir)) fail(dir, "not a checkpoint directory (missing or not a directory)");
  if (fs::is_regular_file(dir / kComplete)) return;
  if (const std::optional<fs::path> latest = latest_checkpoint(dir)) {
    fail(dir, "a checkpoint root (it holds step-NNNNNNNN checkpoints), not a checkpoint: name one of its step "
              "folders, the latest complete one is " + latest->string());
  }
  // An HF model folder (atoll-convert export, the ecosystem's files) is no failed save.
  if (fs::is_regular_file(dir / kConfigFile) && !fs::exists(dir / kTrainerStateFile) &&
      !fs::exists(dir / kOptimizerFile)) {
    fail(dir, "an HF model folder (config.json and weights, no trainer_state.json), not a training checkpoint: "
              "import it first (atoll-convert import " + dir.string() + " OUT_ROOT) and name OUT_ROOT/step-00000000");
  }
  fail(dir / kComplete, "missing: the checkpoint is incomplete (its save did not finish)");
}

CheckpointContents load_checkpoint(const fs::path& dir_in, const CheckpointLoadOptions& options) {
  const fs::path dir = normalised_directory(dir_in);
  require_complete_checkpoint(dir);

  verify_manifest(dir, std::string(kComplete));
  CheckpointContents c;
  c.model = read_model_files(dir).tensors;

  const fs::path optimizer_file = dir / kOptimizerFile;
  TensorMap moments = read_safetensors(optimizer_file).tensors;
  TensorMap exp_avg, exp_avg_sq;
  for (const auto& n : moments.names()) {
    std::string_view name = n;
    if (name.rfind(kExpAvgSqPrefix, 0) == 0) {
      exp_avg_sq.insert(std::string(name.substr(kExpAvgSqPrefix.size())), moments.at(n));
    } else if (name.rfind(kExpAvgPrefix, 0) == 0) {
      exp_avg.insert(std::string(name.substr(kExpAvgPrefix.size())), moments.at(n));
    } else {
      fail(optimizer_file, fmt::format("tensor '{}' is neither exp_avg.<name> nor exp_avg_sq.<name>", n));
    }
  }
  check_optimizer_matches(optimizer_file, c.model, exp_avg, kExpAvgPrefix);
  check_optimizer_matches(optimizer_file, c.model, exp_avg_sq, kExpAvgSqPrefix);
  for (const auto& n : c.model.names()) {
    c.exp_avg.insert(n, exp_avg.at(n));
    c.exp_avg_sq.insert(n, exp_avg_sq.at(n));
  }
  if (!options.allow_nonfinite) check_state_values(dir, optimizer_file, c.model, c.exp_avg, c.exp_avg_sq, kInspectHint);

  const fs::path state_file = dir / kTrainerStateFile;
  c.trainer_state = read_json_file(state_file);
  if (!c.trainer_state.is_object()) fail(state_file, "not a JSON object");
  auto step = c.trainer_state.find("step");
  if (step == c.trainer_state.end() || !step->is_number_integer() || step->get<std::int64_t>() < 0) {
    fail(state_file, "missing non-negative integer \"step\"");
  }
  c.step = step->get<std::int64_t>();
  if (auto named = parse_step_dir_name(dir.filename().string()); named && *named != c.step) {
    fail(state_file, fmt::format("step {} does not match the directory name {}", c.step, dir.filename().string()));
  }

  const fs::path config_file = dir / kConfigFile;
  c.model_config = read_json_file(config_file);
  if (!c.model_config.is_object()) fail(config_file, "not a JSON object");
  return c;
}

}  // namespace atl
