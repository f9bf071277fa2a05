#include "graph/models/flint/config.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "graph/models/config_checks.hpp"

namespace atl {

namespace {
using model_checks::require;

// Full-attention (NoPE) layers by id; every other layer slides with RoPE.
std::vector<std::string> layer_types_with_full(std::int64_t layers, const std::set<std::int64_t>& full) {
  std::vector<std::string> out;
  for (std::int64_t l = 0; l < layers; ++l) out.push_back(full.count(l) ? "full_attention" : "sliding_attention");
  return out;
}

FlintConfig tiny() {
  FlintConfig c;
  c.preset = "flint-tiny";
  c.mlp_only_layers = {0, 1};
  c.layer_types = layer_types_with_full(6, {0, 1, 5});
  return c;
}

// MODELS.md §2.1. moe_intermediate_size is inferred (~768); rope_theta is unknown (kept at the
// tiny value until a checkpoint says otherwise). Planning and documentation only: far too big for
// the CPU reference.
FlintConfig real() {
  FlintConfig c;
  c.preset = "flint";
  c.vocab_size = 150144;
  c.unpadded_vocab_size = 150144;
  c.hidden_size = 2048;
  c.num_hidden_layers = 49;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.intermediate_size = 6144;
  c.moe_intermediate_size = 768;
  c.shared_expert_intermediate_size = 768;
  c.num_experts = 256;
  c.num_experts_per_tok = 6;
  c.mlp_only_layers = {0, 1};
  std::set<std::int64_t> full{0, 1, 48};
  for (std::int64_t l = 5; l <= 45; l += 4) full.insert(l);  // 14 full layers in all
  c.layer_types = layer_types_with_full(49, full);
  c.sliding_window = 513;  // the current token + 512 preceding
  return c;
}
}  // namespace

bool FlintConfig::is_sparse(std::int64_t layer) const {
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

void FlintConfig::validate() const {
  model_checks::sizes(hidden_size, num_hidden_layers, head_dim);
  require(head_dim % 2 == 0, "head_dim", "must be even (RoPE rotates half-dims)");
  model_checks::heads(num_attention_heads, num_key_value_heads);
  model_checks::vocab(unpadded_vocab_size, vocab_size);
  model_checks::layer_types(layer_types, num_hidden_layers);
  std::set<std::int64_t> seen;
  for (std::int64_t l : mlp_only_layers) {
    require(l >= 0 && l < num_hidden_layers, "mlp_only_layers",
            "entries must be layer ids in [0, " + std::to_string(num_hidden_layers) + "), got " + std::to_string(l));
    require(seen.insert(l).second, "mlp_only_layers", "lists layer " + std::to_string(l) + " twice");
  }
  require(sliding_window > 0, "sliding_window", "must be positive");
  const bool any_dense = !mlp_only_layers.empty();
  const bool any_sparse = static_cast<std::int64_t>(mlp_only_layers.size()) < num_hidden_layers;
  if (any_dense) require(intermediate_size > 0, "intermediate_size", "must be positive");
  if (any_sparse) {
    require(num_experts > 0, "num_experts", "must be positive");
    require(num_experts_per_tok > 0 && num_experts_per_tok <= num_experts, "num_experts_per_tok",
            "must be in [1, num_experts]");
    require(moe_intermediate_size > 0, "moe_intermediate_size", "must be positive");
  }
  require(shared_expert_intermediate_size >= 0, "shared_expert_intermediate_size", "must be >= 0 (0 = none)");
}

FlintConfig flint_preset(const std::string& name) {
  if (name == "flint-tiny") return tiny();
  if (name == "flint") return real();
  std::string known;
  for (const auto& n : flint_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown Flint preset '" + name + "' (expected one of: " + known + ")");
}

std::vector<std::string> flint_preset_names() { return {"flint-tiny", "flint"}; }

}  // namespace atl
