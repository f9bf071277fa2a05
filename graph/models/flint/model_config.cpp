#include "graph/models/flint/model_config.hpp"

#include <stdexcept>

#include "graph/config_reader.hpp"

namespace atl {

FlintConfig flint_config_from(const ModelSection& section, const std::string& file) {
  if (section.family != "flint") {
    throw ConfigError(file, "model.family", "expected flint, got '" + section.family + "'");
  }
  FlintConfig c;
  try {
    c = flint_preset(section.preset.empty() ? "flint-tiny" : section.preset);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(file, "model.preset", e.what());
  }
  ConfigReader r(section.overrides, file, "model");
  r.allow("family");
  r.allow("preset");
  c.vocab_size = r.get_positive("vocab_size", c.vocab_size);
  c.unpadded_vocab_size = r.get_positive("unpadded_vocab_size", c.unpadded_vocab_size);
  c.hidden_size = r.get_positive("hidden_size", c.hidden_size);
  c.num_hidden_layers = r.get_positive("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = r.get_positive("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = r.get_positive("num_key_value_heads", c.num_key_value_heads);
  c.head_dim = r.get_positive("head_dim", c.head_dim);
  c.intermediate_size = r.get_positive("intermediate_size", c.intermediate_size);
  c.moe_intermediate_size = r.get_positive("moe_intermediate_size", c.moe_intermediate_size);
  c.shared_expert_intermediate_size =
      r.get_non_negative("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  c.num_experts = r.get_positive("num_experts", c.num_experts);
  c.num_experts_per_tok = r.get_positive("num_experts_per_tok", c.num_experts_per_tok);
  c.mlp_only_layers = r.get("mlp_only_layers", c.mlp_only_layers);
  c.layer_types = r.get("layer_types", c.layer_types);
  c.sliding_window = r.get_positive("sliding_window", c.sliding_window);
  c.rope_theta = r.get("rope_theta", c.rope_theta);
  c.rms_norm_eps = r.get("rms_norm_eps", c.rms_norm_eps);
  c.init_std = r.get("init_std", c.init_std);
  c.norm_topk_prob = r.get("norm_topk_prob", c.norm_topk_prob);
  c.router_weights_fp32 = r.get("router_weights_fp32", c.router_weights_fp32);
  r.check(c.rope_theta > 0, "rope_theta", "a positive number");
  r.check(c.init_std > 0, "init_std", "a positive number");
  r.check(c.rms_norm_eps > 0, "rms_norm_eps", "a positive number");
  r.finish();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    // validate() says "model.<field>: <problem>"; re-raise with the file named.
    const std::string msg = e.what();
    const auto colon = msg.find(": ");
    throw ConfigError(file, msg.substr(0, colon), colon == std::string::npos ? msg : msg.substr(colon + 2));
  }
  return c;
}

}  // namespace atl
