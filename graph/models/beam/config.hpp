// Beam configuration (MODELS.md §3, §4, §10.4) and its presets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct BeamConfig {
  std::string preset;
  std::int64_t vocab_size = 256;
  std::int64_t unpadded_vocab_size = 250;
  std::int64_t hidden_size = 64;
  std::int64_t num_hidden_layers = 4;
  std::int64_t num_attention_heads = 4;
  std::int64_t num_key_value_heads = 2;
  std::int64_t head_dim = 16;
  std::int64_t intermediate_size = 128;     // dense MLP width
  std::int64_t moe_intermediate_size = 32;  // per-expert width
  std::int64_t n_routed_experts = 8;
  std::int64_t num_experts_per_tok = 2;
  std::int64_t n_group = 2;
  std::int64_t topk_group = 1;
  std::int64_t n_shared_experts = 0;
  std::vector<std::string> layer_types;      // "sliding_attention" | "full_attention" per layer
  std::vector<std::string> mlp_layer_types;  // "dense" | "sparse" per layer
  std::int64_t sliding_window = 8;
  float rope_theta = 10000.0f;
  float ssmax_base = 2048.0f;
  float ssmax_exponent = 0.1f;
  float final_logit_softcapping = 30.0f;  // 0 = none
  float rms_norm_eps = 1e-6f;
  float init_std = 0.02f;
  float routed_scaling_factor = 1.0f;
  bool norm_topk_prob = true;
  bool norm_topk_prob_top1 = true;
  bool router_weights_fp32 = false;
  bool depth_scaled_residual = true;

  bool is_sliding(std::int64_t layer) const { return layer_types.at(static_cast<std::size_t>(layer)) == "sliding_attention"; }
  bool is_sparse(std::int64_t layer) const { return mlp_layer_types.at(static_cast<std::size_t>(layer)) == "sparse"; }
  // Throws std::invalid_argument naming the field when the config is inconsistent.
  void validate() const;
};

// beam-tiny-moe, beam-tiny-dense, beam-small; an unknown name throws listing the known ones.
BeamConfig beam_preset(const std::string& name);
std::vector<std::string> beam_preset_names();

}  // namespace atl
