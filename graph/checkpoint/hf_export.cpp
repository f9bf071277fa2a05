#include "graph/checkpoint/hf_export.hpp"

#include <cerrno>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/durable_file.hpp"
#include "graph/checkpoint/json_file.hpp"
#include "graph/checkpoint/model_weights.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "graph/models/model.hpp"

namespace atl {

namespace {

// A folder that cannot be made: the file system's fault (no space, quota, I/O, read-only) is a
// FileWriteError (exit 1), the path's (a file in the way, no permission) bad input.
[[noreturn]] void throw_cannot_create(const std::filesystem::path& dir, const std::error_code& ec) {
  const std::string what = dir.string() + ": cannot create it: " + ec.message();
  const int e = ec.value();
  if (e == ENOSPC || e == EDQUOT || e == EIO || e == EROFS) throw FileWriteError(what);
  throw CheckpointError(what);
}

}  // namespace

RunConfig checkpoint_run_config(const std::filesystem::path& checkpoint_dir) {
  const std::filesystem::path state = checkpoint_dir / "trainer_state.json";
  const nlohmann::json j = read_json_file(state);
  if (!j.is_object() || !j.contains("config")) throw CheckpointError(state.string() + ": no \"config\" (the run config it was saved with)");
  if (!j.at("config").is_object()) {
    throw CheckpointError(state.string() + ": \"config\" must be an object (the run config), got " +
                          j.at("config").type_name());
  }
  // JSON is YAML: the saved resolved config parses back through the same validation.
  nlohmann::json config = saved_config_as_read(j.at("config"));
  config.erase("source_file");  // where it came from, not a config key
  // A sim run saved by a build that ignored multi-process settings may list them set: they never
  // took effect (the process was the whole job), and a config read back now would refuse them.
  nlohmann::json& topology = config["topology"];
  if (topology.is_object() && topology.contains("backend") && topology.at("backend") == "sim") {
    const nlohmann::json defaults = multi_process_settings({});  // (items() of a temporary would dangle)
    for (const auto& [key, value] : defaults.items()) topology.erase(key);
  }
  return parse_run_config(config.dump(), state.string());
}

void export_hf(const std::filesystem::path& checkpoint_dir, const std::filesystem::path& out_dir_given,
               DType bulk_dtype, std::int64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  const fs::path out_dir = normalised_directory(out_dir_given);  // "out/" names out, for the temp name
  if (const std::string problem = name_length_problem(out_dir); !problem.empty()) throw CheckpointError(problem);
  require_complete_checkpoint(checkpoint_dir);
  if (fs::exists(out_dir)) throw CheckpointError(out_dir.string() + ": already exists; export writes a new directory");
  refuse_inside_checkpoint(out_dir, "the export");
  const RunConfig config = checkpoint_run_config(checkpoint_dir);
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  CheckpointContents contents = load_checkpoint(checkpoint_dir);
  // Names, shapes and dtypes exactly the model's: nothing else is exported.
  const TensorMap master = model_weights_from(*model, contents.model, checkpoint_dir.string());
  TensorMap native;
  for (const auto& s : model->specs()) {
    const Tensor& t = master.at(s.name);
    native.insert(s.name, (bulk_dtype == DType::bf16 && !s.island) ? t.to(DType::bf16) : t);
  }
  const std::string tmp_prefix = temporary_prefix(".tmp-", out_dir.filename().string(), "-");
  remove_abandoned_temporaries(parent_folder(out_dir), tmp_prefix);
  const fs::path tmp = out_dir.parent_path() / (tmp_prefix + temporary_tag());
  std::error_code ec;
  fs::remove_all(tmp, ec);  // (a folder that cannot hold it fails the creation next, named)
  try {
    create_directories_durably(tmp);  // (its new parents too: OUT must not vanish with them)
  } catch (const fs::filesystem_error& e) {
    throw_cannot_create(out_dir, e.code());
  }
  auto discard = [&] {  // nothing half-written is left behind
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
  };
  try {
    write_sharded_safetensors(tmp, model->to_hf(native), max_shard_bytes);
    nlohmann::json hf_config = model->hf_config();
    hf_config["torch_dtype"] = bulk_dtype == DType::bf16 ? "bfloat16" : "float32";  // the bulk tensors'
    write_file_durably(tmp / "config.json", hf_config.dump(2) + "\n");
    fs::rename(tmp, out_dir);
  } catch (const fs::filesystem_error& e) {  // named by OUT, not by the temporary
    discard();
    throw_cannot_create(out_dir, e.code());
  } catch (const FileWriteError& e) {  // (a full disk, a quota, ulimit -f): OUT first, then the file
    discard();
    throw FileWriteError(out_dir.string() + ": the export could not be written (nothing is left of it): " + e.what());
  } catch (...) {
    discard();
    throw;
  }
  fsync_directory(parent_folder(out_dir));
}

std::filesystem::path import_hf(const std::filesystem::path& hf_dir, const RunConfig& config,
                                const std::filesystem::path& checkpoint_root) {
  if (const std::string problem = name_length_problem(checkpoint_root); !problem.empty()) throw CheckpointError(problem);
  refuse_inside_checkpoint(checkpoint_root, "the import");  // before any weight is read
  std::shared_ptr<const Model> model = make_model(config.model, config.source_file);
  // The file's tensors and their fp32 copies are gone once the native masters exist (a lambda's
  // locals): the save that follows holds the masters and both moments, not three more copies.
  TensorMap native = [&] {
    SafetensorsContents files = read_model_files(hf_dir);
    // Masters are fp32: every tensor widens before the adapter rearranges it (a file may mix F32
    // and BF16, even among one layer's experts). Other dtypes and non-finite values are refused
    // here, named by the HF folder and tensor (the save would refuse the values too, naming its
    // output).
    TensorMap widened;
    for (const auto& name : files.tensors.names()) {
      const Tensor& t = files.tensors.at(name);
      if (t.dtype() != DType::f32 && t.dtype() != DType::bf16) {
        throw CheckpointError(fmt::format("{}: tensor '{}' is {}; weights must be F32 or BF16", hf_dir.string(), name,
                                          t.describe()));
      }
      check_tensor_values(hf_dir, "tensor '" + name + "'", t, false, kNeverSavedHint);
      widened.insert(name, t.dtype() == DType::f32 ? t : t.to(DType::f32));
    }
    files = SafetensorsContents{};  // the bf16 originals, widened above: not needed by the adapter
    try {
      return model->from_hf(widened);
    } catch (const std::logic_error& e) {  // invalid_argument and out_of_range: a tensor missing or misshapen
      throw CheckpointError(hf_dir.string() + ": the tensors do not fit the model its config.json describes: " +
                            e.what());
    }
  }();
  CheckpointContents contents;
  contents.step = 0;
  for (const auto& s : model->specs()) contents.model.insert(s.name, native.at(s.name));
  contents.exp_avg = TensorMap::zeros_like(model->specs());
  contents.exp_avg_sq = TensorMap::zeros_like(model->specs());
  contents.trainer_state = {{"step", 0}, {"imported_from", hf_dir.string()}, {"family", model->family()},
                            {"preset", model->preset()}, {"config", to_json(config)}};
  contents.model_config = model->hf_config();
  // An import adds a checkpoint; it never replaces one (nor touches the root's others).
  std::error_code ec;
  if (std::filesystem::exists(checkpoint_root, ec) && !std::filesystem::is_directory(checkpoint_root, ec)) {
    throw CheckpointError(checkpoint_root.string() + ": exists and is not a directory; import writes a checkpoint "
                          "into it (OUT_ROOT/step-00000000)");
  }
  const std::filesystem::path target = checkpoint_root / checkpoint_dir_name(0);
  if (std::filesystem::exists(std::filesystem::symlink_status(target))) {
    throw CheckpointError(target.string() + ": already exists; import writes a new step-00000000: choose another "
                          "output directory");
  }
  // Made here (a root that cannot be made is bad input, named), durably, and removed again if
  // the save refuses the weights: a refused import leaves nothing behind.
  namespace fs = std::filesystem;
  const fs::path root = fs::absolute(normalised_directory(checkpoint_root), ec);
  fs::path top = root;  // the highest folder this import creates (root itself when none exists)
  while (!fs::exists(top.parent_path(), ec) && top.parent_path() != top) top = top.parent_path();
  const bool made = !fs::exists(root, ec);
  fs::create_directories(root, ec);
  if (ec) throw_cannot_create(checkpoint_root, ec);
  if (made) fsync_directory(top.parent_path());
  auto discard = [&] {
    for (fs::path p = root; made; p = p.parent_path()) {  // each only while empty
      if (!fs::remove(p, ec) || p == top) break;
    }
  };
  try {
    return save_checkpoint(checkpoint_root, contents, 0);
  } catch (const fs::filesystem_error& e) {  // a root that refuses the checkpoint: named, not its temporary
    discard();
    throw_cannot_create(target, e.code());
  } catch (const FileWriteError& e) {
    discard();  // (a failure after the checkpoint's rename, fsyncing its folder, leaves it in place)
    throw FileWriteError(target.string() + ": the import could not be written" +
                         (fs::exists(target, ec) ? " (the folder is there: check it before use): "
                                                 : " (nothing is left of it): ") +
                         e.what());
  } catch (...) {
    discard();
    throw;
  }
}

}  // namespace atl
