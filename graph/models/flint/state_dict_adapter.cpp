// Flint's HF layout (MODELS.md §5.8, §10.3): the source keeps its names except three conversions:
//   model.layers.L.self_attn._fp32_params.sinks      <-> model.layers.L.self_attn.softmax_offset
//   model.layers.L.mlp.shared_experts.{g,u,d}_proj    <-> model.layers.L.mlp.shared_expert.{g,u,d}_proj
//   model.layers.L.mlp.experts.gate_and_up_projs [E,H,2I] / down_projs [E,I,H]
//                                                     <-> per expert model.layers.L.mlp.experts.e.{gate,up,down}_proj.weight
// Every tensor keeps its dtype and bytes, so from_hf(to_hf(x)) == x bitwise.
#include <set>
#include <stdexcept>

#include "graph/models/flint/model.hpp"
#include "graph/models/hf_layout.hpp"

namespace atl {

namespace {
constexpr const char* kGateUp = "mlp.experts.gate_and_up_projs";
constexpr const char* kDown = "mlp.experts.down_projs";
constexpr const char* kNativeSinks = "self_attn._fp32_params.sinks";
constexpr const char* kHfSinks = "self_attn.softmax_offset";
constexpr const char* kNativeShared = ".mlp.shared_experts.";
constexpr const char* kHfShared = ".mlp.shared_expert.";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
std::string without_tail(const std::string& s, const std::string& tail) { return s.substr(0, s.size() - tail.size()); }
std::string experts_prefix(const std::string& native_gate_up) { return without_tail(native_gate_up, kGateUp) + "mlp.experts"; }

// The HF name of a native tensor that is not one of the grouped experts.
std::string hf_name(const std::string& native) {
  if (ends_with(native, kNativeSinks)) return without_tail(native, kNativeSinks) + kHfSinks;
  if (const auto at = native.find(kNativeShared); at != std::string::npos) {
    return native.substr(0, at) + kHfShared + native.substr(at + std::string(kNativeShared).size());
  }
  return native;
}
}  // namespace

nlohmann::json FlintModel::hf_config() const {
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
          {"norm_topk_prob", c.norm_topk_prob},
          {"router_aux_loss_coef", 0.0},  // CE-only training (MODELS.md §2.1)
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"tie_word_embeddings", false},
          {"atoll_preset", c.preset}};
}

TensorMap FlintModel::to_hf(const TensorMap& native) const {
  TensorMap hf;
  for (const auto& s : specs_) {
    if (ends_with(s.name, kDown)) continue;  // written together with its gate_and_up
    if (ends_with(s.name, kGateUp)) {
      per_expert_to_hf(experts_prefix(s.name), native.at(s.name), native.at(without_tail(s.name, kGateUp) + kDown), hf);
    } else {
      hf.insert(hf_name(s.name), native.at(s.name));
    }
  }
  return hf;
}

TensorMap FlintModel::from_hf(const TensorMap& hf) const {
  TensorMap native;
  std::set<std::string> used;
  Tensor pending_down;
  for (const auto& s : specs_) {
    if (ends_with(s.name, kGateUp)) {
      const std::string prefix = experts_prefix(s.name);
      auto [gate_up, down] = per_expert_from_hf(prefix, config_.num_experts, hf);
      if (gate_up.shape() != s.shape) {
        throw std::invalid_argument("HF state dict: experts under '" + prefix + "' assemble to " +
                                    gate_up.describe() + ", expected " + shape_string(s.shape));
      }
      for (std::int64_t e = 0; e < config_.num_experts; ++e) {
        for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
          used.insert(prefix + "." + std::to_string(e) + "." + w + ".weight");
        }
      }
      native.insert(s.name, gate_up);
      pending_down = down;
    } else if (ends_with(s.name, kDown)) {
      native.insert(s.name, pending_down);
    } else {
      const std::string name = hf_name(s.name);
      native.insert(s.name, require_hf_tensor(hf, name, s.shape));
      used.insert(name);
    }
  }
  for (const auto& name : hf.names()) {
    if (!used.count(name)) throw std::invalid_argument("HF state dict: unexpected tensor '" + name + "' for Flint");
  }
  return native;
}

}  // namespace atl
