// Tensor rearrangements the HF state-dict adapters share. All preserve the dtype (any element
// type) and copy bytes exactly, so adapters round-trip bitwise; tensors they stack or join must
// share one dtype (an import widens every weight to F32 first).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/param.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// A config.json object whose numbers that are floats print as the shortest decimal that reads back
// as the same float (0.02, not 0.019999999552965164): the config's float fields, widened to double.
nlohmann::json with_short_floats(nlohmann::json config);
// final_logit_softcapping as config.json holds it: null for none (MODELS.md §3.1: absent = none;
// HF code tests `is not None`, and a 0 there would divide by it).
inline nlohmann::json softcap_field(float cap) { return cap > 0 ? nlohmann::json(cap) : nlohmann::json(nullptr); }

// [..., a, b] -> [..., b, a]
Tensor transpose_last_two(const Tensor& t);
// Stack equal-shaped tensors along a new dim 0 / split dim 0 into its slices (copies).
Tensor stack(const std::vector<Tensor>& parts);
std::vector<Tensor> unstack(const Tensor& t);
// Concatenate / split along the last dim.
Tensor concat_last(const Tensor& a, const Tensor& b);
std::pair<Tensor, Tensor> split_last(const Tensor& t, std::int64_t first);

// Grouped experts, native [E, H, 2I] (gate | up concatenated) and [E, I, H], to and from HF per-expert
// Linear weights `<prefix>.<e>.gate_proj.weight [I, H]`, `up_proj [I, H]`, `down_proj [H, I]`
// (MODELS.md §5.8, Flint and Beam). `prefix` is e.g. "model.layers.0.mlp.experts".
void per_expert_to_hf(const std::string& prefix, const Tensor& gate_and_up, const Tensor& down, TensorMap& hf);
// `<prefix>.<expert>.<weight>.weight`: the HF name of one expert's gate_proj, up_proj or down_proj.
std::string expert_weight_name(const std::string& prefix, std::int64_t expert, const char* weight);
// Reads the 3E per-expert tensors for a native gate_and_up of shape [E, H, 2I], each checked
// against its own shape and named; returns {gate_and_up, down [E, I, H]}.
std::pair<Tensor, Tensor> per_expert_from_hf(const std::string& prefix, const Shape& gate_and_up, const TensorMap& hf);

// The whole adapter of a family whose HF layout differs from the native one only by per-expert
// experts (`...mlp.experts.gate_and_up_projs` / `down_projs`, converted as above) and by names
// (`hf_name` maps every other native name). from_hf checks shapes and rejects unexpected tensors,
// naming them; `family` appears in the message.
using HfName = std::string (*)(const std::string& native);
TensorMap per_expert_layout_to_hf(const std::vector<ParamSpec>& specs, const TensorMap& native, HfName hf_name);
TensorMap per_expert_layout_from_hf(const std::vector<ParamSpec>& specs, const TensorMap& hf, HfName hf_name,
                                    const std::string& family);

// A tensor that must exist in an HF map, with the shape expected; the error names both.
const Tensor& require_hf_tensor(const TensorMap& hf, const std::string& name, const Shape& shape);

}  // namespace atl
