// The masters of a checkpoint as a model's weights: every tensor the model declares, f32, of its
// shape, nothing else, in the model's spec order. Errors name `where` (the checkpoint) and the tensor.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "graph/models/model.hpp"

namespace atl {

TensorMap model_weights_from(const Model& model, const TensorMap& tensors, const std::string& where);

// The same, first checking that the checkpoint's config.json (`model_config`) names the model's
// family: a checkpoint of another family is refused as such, not by its first missing tensor.
TensorMap model_weights_from(const Model& model, const TensorMap& tensors, const nlohmann::json& model_config,
                             const std::string& where);

}  // namespace atl
