#include "graph/models/flint/model_config.hpp"

#include "graph/config_reader.hpp"
#include "graph/models/family_config.hpp"

namespace atl {

FlintConfig flint_config_from(const ModelSection& section, const std::string& file) {
  return read_family_config<FlintConfig>(
      section, file, "flint", "flint-tiny", flint_preset, [](ConfigReader& r, FlintConfig& c) {
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
      });
}

}  // namespace atl
