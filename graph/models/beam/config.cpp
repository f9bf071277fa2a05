#include "graph/models/beam/config.hpp"

#include <stdexcept>

#include "graph/models/config_checks.hpp"

namespace atl {

namespace {
using model_checks::require;

BeamConfig tiny_moe() {
  BeamConfig c;
  c.preset = "beam-tiny-moe";
  c.layer_types = {"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"};
  c.mlp_layer_types = {"sparse", "sparse", "sparse", "sparse"};
  return c;
}
}  // namespace

void BeamConfig::validate() const {
  model_checks::sizes(hidden_size, num_hidden_layers, head_dim);
  require(head_dim % 2 == 0, "head_dim", "must be even (RoPE rotates half-dims)");
  model_checks::heads(num_attention_heads, num_key_value_heads);
  model_checks::vocab(unpadded_vocab_size, vocab_size);
  model_checks::layer_types(layer_types, num_hidden_layers);
  require(static_cast<std::int64_t>(mlp_layer_types.size()) == num_hidden_layers, "mlp_layer_types",
          "needs one entry per layer (" + std::to_string(num_hidden_layers) + ")");
  bool any_sparse = false;
  for (const auto& t : mlp_layer_types) {
    require(t == "dense" || t == "sparse", "mlp_layer_types", "entries must be dense or sparse, got '" + t + "'");
    any_sparse |= t == "sparse";
  }
  require(sliding_window > 0, "sliding_window", "must be positive");
  if (any_sparse) {
    model_checks::routing("n_routed_experts", n_routed_experts, num_experts_per_tok, n_group, topk_group);
    require(moe_intermediate_size > 0, "moe_intermediate_size", "must be positive");
  }
  require(n_shared_experts >= 0, "n_shared_experts", "must be >= 0");
  require(final_logit_softcapping >= 0, "final_logit_softcapping", "must be >= 0 (0 = none)");
}

BeamConfig beam_preset(const std::string& name) {
  if (name == "beam-tiny-moe") return tiny_moe();
  if (name == "beam-tiny-dense") {
    BeamConfig c = tiny_moe();
    c.preset = name;
    c.mlp_layer_types = {"dense", "dense", "dense", "dense"};
    return c;
  }
  if (name == "beam-small") {
    BeamConfig c = tiny_moe();
    c.preset = name;
    c.hidden_size = 256;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 32;
    c.moe_intermediate_size = 256;
    c.intermediate_size = 1024;
    c.sliding_window = 64;
    return c;
  }
  std::string known;
  for (const auto& n : beam_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown Beam preset '" + name + "' (expected one of: " + known + ")");
}

std::vector<std::string> beam_preset_names() { return {"beam-tiny-moe", "beam-tiny-dense", "beam-small"}; }

}  // namespace atl
