#include "graph/models/inkling2/config.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "graph/models/config_checks.hpp"

namespace atl {

namespace {
using model_checks::require;

Inkling2Config tiny() {
  Inkling2Config c;
  c.preset = "inkling2-tiny";
  return c;
}
}  // namespace

bool Inkling2Config::is_local(std::int64_t layer) const {
  return std::find(local_layer_ids.begin(), local_layer_ids.end(), layer) != local_layer_ids.end();
}

std::int64_t Inkling2Config::qkvr_rows(std::int64_t layer) const {
  const std::int64_t base =
      num_attention_heads * head_dim + 2 * num_key_value_heads * head_dim + num_attention_heads * d_rel;
  return is_local(layer) ? base : base + 2 * num_key_value_heads * conv_kernel_size;
}

void Inkling2Config::validate() const {
  model_checks::sizes(hidden_size, num_hidden_layers, head_dim);
  model_checks::heads(num_attention_heads, num_key_value_heads);
  require(hidden_size % head_dim == 0, "head_dim",
          "must divide hidden_size (attn_sconv and mlp_sconv taps are [hidden_size/head_dim, W])");
  model_checks::vocab(unpadded_vocab_size, vocab_size);
  require(n_layers_per_attnres_block > 0, "n_layers_per_attnres_block", "must be positive");
  std::set<std::int64_t> seen;
  for (std::int64_t id : local_layer_ids) {
    require(id >= 0 && id < num_hidden_layers, "local_layer_ids",
            "entries must be layer ids in [0, " + std::to_string(num_hidden_layers) + "), got " + std::to_string(id));
    require(seen.insert(id).second, "local_layer_ids", "lists layer " + std::to_string(id) + " twice");
  }
  require(sliding_window_size > 0, "sliding_window_size", "must be positive");
  require(d_rel > 0, "d_rel", "must be positive");
  require(rel_extent > 0, "rel_extent", "must be positive");
  require(conv_kernel_size > 0, "conv_kernel_size", "must be positive");
  require(moe_intermediate_size > 0, "moe_intermediate_size", "must be positive");
  require(n_shared_experts == 0, "n_shared_experts",
          "Inkling2 has no shared experts (MODELS.md §10.2.7); must be 0, got " + std::to_string(n_shared_experts));
  model_checks::routing("n_routed_experts", n_routed_experts, num_experts_per_tok, n_group, topk_group);
  require(expert_gate_cap > 0, "expert_gate_cap", "must be positive");
  require(expert_up_cap > 0, "expert_up_cap", "must be positive");
  require(log_scaling_n_floor >= 0, "log_scaling_n_floor", "must be >= 0 (0 = no log scaling)");
  require(l2_clip_radius_q >= 0, "l2_clip_radius_q", "must be >= 0 (0 = the default sqrt(head_dim))");
  require(l2_clip_radius_k >= 0, "l2_clip_radius_k", "must be >= 0 (0 = the default sqrt(head_dim))");
  require(l2_clip_radius_r >= 0, "l2_clip_radius_r", "must be >= 0 (0 = the default sqrt(d_rel))");
  require(final_logit_softcapping >= 0, "final_logit_softcapping", "must be >= 0 (0 = none)");
}

Inkling2Config inkling2_preset(const std::string& name) {
  if (name == "inkling2-tiny") return tiny();
  if (name == "inkling2-tiny-deep") {
    Inkling2Config c = tiny();
    c.preset = name;
    c.num_hidden_layers = 6;
    c.local_layer_ids = {0, 1, 3, 4};  // full: 2, 5
    return c;
  }
  if (name == "inkling2-mini") {
    // Inkling-2-Mini's non-looped decoder (MODELS.md §1.1, §4): for planning and docs.
    Inkling2Config c;
    c.preset = name;
    c.vocab_size = 201024;
    c.unpadded_vocab_size = 200058;
    c.hidden_size = 2304;
    c.num_hidden_layers = 24;
    c.n_layers_per_attnres_block = 6;
    c.local_layer_ids.clear();
    for (std::int64_t l = 0; l < 24; ++l) {
      if ((l + 1) % 6 != 0) c.local_layer_ids.push_back(l);  // global at 5, 11, 17, 23
    }
    c.sliding_window_size = 1024;
    c.num_attention_heads = 24;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.d_rel = 16;
    c.rel_extent = 1024;
    c.conv_kernel_size = 4;
    c.n_routed_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 1152;
    return c;
  }
  std::string known;
  for (const auto& n : inkling2_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown Inkling2 preset '" + name + "' (expected one of: " + known + ")");
}

std::vector<std::string> inkling2_preset_names() { return {"inkling2-tiny", "inkling2-tiny-deep", "inkling2-mini"}; }

}  // namespace atl
