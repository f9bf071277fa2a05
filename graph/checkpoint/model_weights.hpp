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

// How the checkpoint's model (its config.json) differs from `model` in settings that keep every
// tensor's shape (rope_theta, rms_norm_eps, sliding_window, ...): "rope_theta 10000.0 -> 500000.0,
// ..." (the checkpoint's value first), or "" when they agree. Only the keys `model` writes and the
// checkpoint has are compared (a foreign config.json may carry more, an old one fewer), less
// initializer_range and atoll_preset, which change nothing the weights compute.
std::string model_config_changes(const Model& model, const CheckpointContents& checkpoint);

}  // namespace atl
