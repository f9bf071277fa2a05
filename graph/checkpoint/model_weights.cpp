#include "graph/checkpoint/model_weights.hpp"

#include "graph/checkpoint/checkpoint_error.hpp"
#include "graph/checkpoint/config_value.hpp"

namespace atl {

TensorMap model_weights_from(const Model& model, const TensorMap& tensors, const std::string& where) {
  TensorMap out;
  for (const auto& s : model.specs()) {
    if (!tensors.contains(s.name)) {
      throw CheckpointError(where + ": no tensor '" + s.name + "' for " + model.family() + " " + model.preset());
    }
    const Tensor& t = tensors.at(s.name);
    if (t.shape() != s.shape || t.dtype() != DType::f32) {
      throw CheckpointError(where + ": tensor '" + s.name + "' is " + t.describe() + ", " + model.family() + " " +
                            model.preset() + " expects f32" + shape_string(s.shape));
    }
    out.insert(s.name, t);
  }
  if (tensors.names().size() != model.specs().size()) {
    throw CheckpointError(where + ": holds " + std::to_string(tensors.names().size()) + " tensors, " + model.family() +
                          " " + model.preset() + " has " + std::to_string(model.specs().size()));
  }
  return out;
}

void check_checkpoint_family(const Model& model, const CheckpointContents& checkpoint, const std::string& where) {
  const nlohmann::json& config = checkpoint.model_config;
  const auto type = config.is_object() ? config.find("model_type") : config.end();
  if (type != config.end() && type->is_string() && type->get<std::string>() != model.family()) {
    throw CheckpointError(where + ": holds a " + type->get<std::string>() + " model (config.json model_type), the config "
                          "describes " + model.family() + " " + model.preset());
  }
}

std::string model_config_changes(const Model& model, const CheckpointContents& checkpoint) {
  const nlohmann::json& saved = checkpoint.model_config;
  if (!saved.is_object()) return "";
  std::string changes;
  const nlohmann::json now = model.hf_config();  // (items() of a temporary would dangle)
  for (const auto& [key, value] : now.items()) {
    // Neither changes what the weights compute: the init scale (used only by a fresh model) and
    // the preset's name (two names for one model).
    if (key == "initializer_range" || key == "atoll_preset") continue;
    const auto was = saved.find(key);
    if (was == saved.end() || same_config_value(*was, value)) continue;  // (as older builds wrote floats too)
    changes.append(changes.empty() ? "" : ", ").append(key + " " + was->dump() + " -> " + value.dump());
  }
  return changes;
}

TensorMap model_weights_from(const Model& model, const CheckpointContents& checkpoint, const std::string& where) {
  check_checkpoint_family(model, checkpoint, where);
  return model_weights_from(model, checkpoint.model, where);
}

}  // namespace atl
