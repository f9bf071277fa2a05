// Flint configuration (MODELS.md §2, §4, §10.3) and its presets. Field names follow the Flint
// (Qwen2-MoE based) HF config.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct FlintConfig {
  std::string preset;
  std::int64_t vocab_size = 256;
  std::int64_t unpadded_vocab_size = 250;
  std::int64_t hidden_size = 64;
  std::int64_t num_hidden_layers = 6;
  std::int64_t num_attention_heads = 4;
  std::int64_t num_key_value_heads = 2;
  std::int64_t head_dim = 16;
  std::int64_t intermediate_size = 128;               // dense MLP width (mlp_only_layers)
  std::int64_t moe_intermediate_size = 32;            // per-expert width
  std::int64_t shared_expert_intermediate_size = 32;  // ungated shared expert width; 0 = no shared expert
  std::int64_t num_experts = 8;
  std::int64_t num_experts_per_tok = 2;
  std::vector<std::int64_t> mlp_only_layers;  // layers with a dense MLP; every other layer is MoE
  std::vector<std::string> layer_types;       // "sliding_attention" | "full_attention" per layer
  std::int64_t sliding_window = 5;            // visible keys 0 <= q-k <= sliding_window-1 (§10.3.5)
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  float init_std = 0.02f;
  bool norm_topk_prob = false;        // Qwen2-MoE default: softmax-over-E weights, not renormalised
  bool router_weights_fp32 = false;   // else routing weights are rounded to bf16 in bf16 runs

  bool is_sliding(std::int64_t layer) const { return layer_types.at(static_cast<std::size_t>(layer)) == "sliding_attention"; }
  bool is_sparse(std::int64_t layer) const;
  // Throws std::invalid_argument ("model.<field>: <problem>") when the config is inconsistent.
  void validate() const;
};

// flint-tiny (CPU tests) and flint (real size, planning and documentation only); an unknown name
// throws listing the known ones.
FlintConfig flint_preset(const std::string& name);
std::vector<std::string> flint_preset_names();

}  // namespace atl
