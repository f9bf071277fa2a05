// Flint's HF layout (MODELS.md §5.8, §10.3): the source keeps its names except three conversions:
//   model.layers.L.self_attn._fp32_params.sinks      <-> model.layers.L.self_attn.softmax_offset
//   model.layers.L.mlp.shared_experts.{g,u,d}_proj    <-> model.layers.L.mlp.shared_expert.{g,u,d}_proj
//   model.layers.L.mlp.experts.gate_and_up_projs [E,H,2I] / down_projs [E,I,H]
//                                                     <-> per expert model.layers.L.mlp.experts.e.{gate,up,down}_proj.weight
// Every tensor keeps its dtype and bytes, so from_hf(to_hf(x)) == x bitwise.
#include "graph/models/flint/model.hpp"
#include "graph/models/hf_layout.hpp"

namespace atl {

namespace {
constexpr const char* kNativeSinks = "self_attn._fp32_params.sinks";
constexpr const char* kHfSinks = "self_attn.softmax_offset";
constexpr const char* kNativeShared = ".mlp.shared_experts.";
constexpr const char* kHfShared = ".mlp.shared_expert.";

std::string without_tail(const std::string& s, const std::string& tail) { return s.substr(0, s.size() - tail.size()); }

// The HF name of a native tensor that is not one of the grouped experts.
std::string hf_name(const std::string& native) {
  if (native.ends_with(kNativeSinks)) return without_tail(native, kNativeSinks) + kHfSinks;
  if (const auto at = native.find(kNativeShared); at != std::string::npos) {
    return native.substr(0, at) + kHfShared + native.substr(at + std::string(kNativeShared).size());
  }
  return native;
}
}  // namespace

nlohmann::json FlintModel::hf_fields() const {
  const auto& c = config_;
  return {{"architectures", {"FlintForCausalLM"}},
          {"model_type", "flint"},
          {"vocab_size", c.vocab_size},
          {"unpadded_vocab_size", c.unpadded_vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"intermediate_size", c.intermediate_size},
          {"moe_intermediate_size", c.moe_intermediate_size},
          {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
          {"num_experts", c.num_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"mlp_only_layers", c.mlp_only_layers},
          {"layer_types", c.layer_types},
          {"sliding_window", c.sliding_window},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"initializer_range", c.init_std},
          {"router_weights_fp32", c.router_weights_fp32},  // numerics of bf16 runs: part of the model
          {"norm_topk_prob", c.norm_topk_prob},
          {"router_aux_loss_coef", 0.0},  // CE-only training (MODELS.md §2.1)
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"tie_word_embeddings", false},
          {"atoll_preset", c.preset}};
}

TensorMap FlintModel::to_hf(const TensorMap& native) const {
  return per_expert_layout_to_hf(specs_, native, hf_name);
}

TensorMap FlintModel::from_hf(const TensorMap& hf) const {
  return per_expert_layout_from_hf(specs(), hf, hf_name, "Flint");
}

}  // namespace atl
