// The masters of a checkpoint as a model's weights: every tensor the model declares, f32, of its
// shape, nothing else, in the model's spec order. Errors name `where` (the checkpoint) and the tensor.
#pragma once
#include <string>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/models/model.hpp"

namespace atl {

TensorMap model_weights_from(const Model& model, const TensorMap& tensors, const std::string& where);

// A loaded checkpoint's masters as the model's weights, first checking that its config.json names
// the model's family: a checkpoint of another family is refused as such, not by its first
// missing tensor.
TensorMap model_weights_from(const Model& model, const CheckpointContents& checkpoint, const std::string& where);
// That family check alone (CheckpointError naming `where`).
void check_checkpoint_family(const Model& model, const CheckpointContents& checkpoint, const std::string& where);

}  // namespace atl
