// Beam's HF layout (MODELS.md §10.4.7): native names equal HF names except the grouped experts,
// which HF stores per expert (converted as Flint's, §5.8).
#include <set>
#include <stdexcept>

#include "graph/models/beam/model.hpp"
#include "graph/models/hf_layout.hpp"

namespace atl {

namespace {
constexpr const char* kGateUp = "mlp.experts.gate_and_up_projs";
constexpr const char* kDown = "mlp.experts.down_projs";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
std::string experts_prefix(const std::string& native_gate_up) {
  return native_gate_up.substr(0, native_gate_up.size() - std::string(kGateUp).size()) + "mlp.experts";
}
}  // namespace

nlohmann::json BeamModel::hf_config() const {
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
          {"final_logit_softcapping", c.final_logit_softcapping},
          {"rms_norm_eps", c.rms_norm_eps},
          {"initializer_range", c.init_std},
          {"routed_scaling_factor", c.routed_scaling_factor},
          {"norm_topk_prob", c.norm_topk_prob},
          {"norm_topk_prob_top1", c.norm_topk_prob_top1},
          {"depth_scaled_residual", c.depth_scaled_residual},
          {"tie_word_embeddings", false},
          {"atoll_preset", c.preset}};
}

TensorMap BeamModel::to_hf(const TensorMap& native) const {
  TensorMap hf;
  for (const auto& s : specs_) {
    if (ends_with(s.name, kDown)) continue;  // written together with its gate_and_up
    if (ends_with(s.name, kGateUp)) {
      const std::string down = s.name.substr(0, s.name.size() - std::string(kGateUp).size()) + kDown;
      per_expert_to_hf(experts_prefix(s.name), native.at(s.name), native.at(down), hf);
    } else {
      hf.insert(s.name, native.at(s.name));
    }
  }
  return hf;
}

TensorMap BeamModel::from_hf(const TensorMap& hf) const {
  TensorMap native;
  std::set<std::string> used;
  Tensor pending_down;
  for (const auto& s : specs_) {
    if (ends_with(s.name, kGateUp)) {
      const std::string prefix = experts_prefix(s.name);
      auto [gate_up, down] = per_expert_from_hf(prefix, config_.n_routed_experts, hf);
      if (gate_up.shape() != s.shape) {
        throw std::invalid_argument("HF state dict: experts under '" + prefix + "' assemble to " +
                                    gate_up.describe() + ", expected " + shape_string(s.shape));
      }
      for (std::int64_t e = 0; e < config_.n_routed_experts; ++e) {
        for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
          used.insert(prefix + "." + std::to_string(e) + "." + w + ".weight");
        }
      }
      native.insert(s.name, gate_up);
      pending_down = down;
    } else if (ends_with(s.name, kDown)) {
      native.insert(s.name, pending_down);
    } else {
      native.insert(s.name, require_hf_tensor(hf, s.name, s.shape));
      used.insert(s.name);
    }
  }
  for (const auto& name : hf.names()) {
    if (!used.count(name)) throw std::invalid_argument("HF state dict: unexpected tensor '" + name + "' for Beam");
  }
  return native;
}

}  // namespace atl
