// Beam's HF layout (MODELS.md §10.4.7): native names equal HF names except the grouped experts,
// which HF stores per expert (converted as Flint's, §5.8).
#include "graph/models/beam/model.hpp"
#include "graph/models/hf_layout.hpp"

namespace atl {

namespace {
std::string same_name(const std::string& native) { return native; }  // HF names equal native ones
}  // namespace

nlohmann::json BeamModel::hf_fields() const {
  const auto& c = config_;
  return {{"architectures", {"BeamForCausalLM"}},
          {"model_type", "beam"},
          {"vocab_size", c.vocab_size},
          {"unpadded_vocab_size", c.unpadded_vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"intermediate_size", c.intermediate_size},
          {"moe_intermediate_size", c.moe_intermediate_size},
          {"n_routed_experts", c.n_routed_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"n_group", c.n_group},
          {"topk_group", c.topk_group},
          {"n_shared_experts", c.n_shared_experts},
          {"layer_types", c.layer_types},
          {"mlp_layer_types", c.mlp_layer_types},
          {"sliding_window", c.sliding_window},
          {"rope_theta", c.rope_theta},
          {"ssmax_base", c.ssmax_base},
          {"ssmax_exponent", c.ssmax_exponent},
          {"final_logit_softcapping", softcap_field(c.final_logit_softcapping)},
          {"rms_norm_eps", c.rms_norm_eps},
          {"initializer_range", c.init_std},
          {"router_weights_fp32", c.router_weights_fp32},  // numerics of bf16 runs: part of the model
          {"routed_scaling_factor", c.routed_scaling_factor},
          {"norm_topk_prob", c.norm_topk_prob},
          {"norm_topk_prob_top1", c.norm_topk_prob_top1},
          {"depth_scaled_residual", c.depth_scaled_residual},
          {"tie_word_embeddings", false},
          {"atoll_preset", c.preset}};
}

TensorMap BeamModel::to_hf(const TensorMap& native) const {
  return per_expert_layout_to_hf(specs_, native, same_name);
}

TensorMap BeamModel::from_hf(const TensorMap& hf) const {
  return per_expert_layout_from_hf(specs(), hf, same_name, "Beam");
}

}  // namespace atl
