// Inkling2 configuration (MODELS.md §1.1, §4, §10.2) and its presets.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct Inkling2Config {
  std::string preset;
  std::int64_t vocab_size = 256;
  std::int64_t unpadded_vocab_size = 250;
  std::int64_t hidden_size = 64;
  std::int64_t num_hidden_layers = 4;
  std::int64_t n_layers_per_attnres_block = 2;         // n: layer l is a block boundary iff l % n == 0
  std::vector<std::int64_t> local_layer_ids{0, 1, 2};  // sliding-window layers; the others are full
  std::int64_t sliding_window_size = 8;                // visible keys incl. the current one; also R of local layers
  std::int64_t num_attention_heads = 4;
  std::int64_t num_key_value_heads = 2;
  std::int64_t head_dim = 16;
  std::int64_t d_rel = 8;             // dr: relative feature width per query head
  std::int64_t rel_extent = 16;       // R of full layers
  std::int64_t conv_kernel_size = 4;  // W
  std::int64_t n_routed_experts = 8;
  std::int64_t num_experts_per_tok = 2;
  std::int64_t moe_intermediate_size = 32;
  std::int64_t n_shared_experts = 0;  // must stay 0 (MODELS.md §10.2.7)
  std::int64_t n_group = 1;
  std::int64_t topk_group = 1;
  float route_scale = 1.0f;
  bool norm_topk_prob = true;
  bool router_weights_fp32 = false;
  float expert_gate_cap = 4.0f;  // βg of the capped SwiGLU
  float expert_up_cap = 25.0f;   // βu
  float log_scaling_alpha = 0.1f;
  float log_scaling_n_floor = 0.0f;  // 0 = null: no log scaling
  bool use_value_norm_no_gamma = false;
  bool use_attention_gate = false;  // optional per-head sigmoid output gate `self_attn.gate`
  float l2_clip_radius_q = 0.0f;    // 0 = sqrt(head_dim)
  float l2_clip_radius_k = 0.0f;    // 0 = sqrt(head_dim)
  float l2_clip_radius_r = 0.0f;    // 0 = sqrt(d_rel)
  float final_logit_softcapping = 30.0f;
  float rms_norm_eps = 1e-6f;
  float init_std = 0.02f;

  bool is_local(std::int64_t layer) const;
  bool is_boundary(std::int64_t layer) const { return layer % n_layers_per_attnres_block == 0; }
  bool is_sparse(std::int64_t /*layer*/) const { return true; }  // every layer's MLP is an MoE
  // Completed blocks before layer l: ceil(l / n).
  std::int64_t completed_blocks_before(std::int64_t layer) const {
    return (layer + n_layers_per_attnres_block - 1) / n_layers_per_attnres_block;
  }
  // Depth queries of the attention mix: 0 at layer 0, 3 on full layers, 1 on local layers.
  std::int64_t attn_query_count(std::int64_t layer) const { return layer == 0 ? 0 : (is_local(layer) ? 1 : 3); }
  std::int64_t attn_norm_count(std::int64_t layer) const { return is_local(layer) ? 1 : 3; }
  std::int64_t relative_extent(std::int64_t layer) const { return is_local(layer) ? sliding_window_size : rel_extent; }
  // Rows of self_attn.qkvr: q | k | v | r | (k-taps | v-taps on full layers).
  std::int64_t qkvr_rows(std::int64_t layer) const;
  float radius_q() const { return l2_clip_radius_q > 0 ? l2_clip_radius_q : std::sqrt(static_cast<float>(head_dim)); }
  float radius_k() const { return l2_clip_radius_k > 0 ? l2_clip_radius_k : std::sqrt(static_cast<float>(head_dim)); }
  float radius_r() const { return l2_clip_radius_r > 0 ? l2_clip_radius_r : std::sqrt(static_cast<float>(d_rel)); }
  // Throws std::invalid_argument "model.<field>: <problem>" when the config is inconsistent.
  void validate() const;
};

// inkling2-tiny, inkling2-tiny-deep, inkling2-mini; an unknown name throws listing the known ones.
Inkling2Config inkling2_preset(const std::string& name);
std::vector<std::string> inkling2_preset_names();

}  // namespace atl
