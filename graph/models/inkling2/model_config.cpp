#include "graph/models/inkling2/model_config.hpp"

#include "graph/config_reader.hpp"
#include "graph/models/family_config.hpp"

namespace atl {

Inkling2Config inkling2_config_from(const ModelSection& section, const std::string& file) {
  return read_family_config<Inkling2Config>(
      section, file, "inkling2", "inkling2-tiny", inkling2_preset, [](ConfigReader& r, Inkling2Config& c) {
        c.vocab_size = r.get_positive("vocab_size", c.vocab_size);
        c.unpadded_vocab_size = r.get_positive("unpadded_vocab_size", c.unpadded_vocab_size);
        c.hidden_size = r.get_positive("hidden_size", c.hidden_size);
        c.num_hidden_layers = r.get_positive("num_hidden_layers", c.num_hidden_layers);
        c.n_layers_per_attnres_block = r.get_positive("n_layers_per_attnres_block", c.n_layers_per_attnres_block);
        c.local_layer_ids = r.get("local_layer_ids", c.local_layer_ids);
        c.sliding_window_size = r.get_positive("sliding_window_size", c.sliding_window_size);
        c.num_attention_heads = r.get_positive("num_attention_heads", c.num_attention_heads);
        c.num_key_value_heads = r.get_positive("num_key_value_heads", c.num_key_value_heads);
        c.head_dim = r.get_positive("head_dim", c.head_dim);
        c.d_rel = r.get_positive("d_rel", c.d_rel);
        c.rel_extent = r.get_positive("rel_extent", c.rel_extent);
        c.conv_kernel_size = r.get_positive("conv_kernel_size", c.conv_kernel_size);
        c.n_routed_experts = r.get_positive("n_routed_experts", c.n_routed_experts);
        c.num_experts_per_tok = r.get_positive("num_experts_per_tok", c.num_experts_per_tok);
        c.moe_intermediate_size = r.get_positive("moe_intermediate_size", c.moe_intermediate_size);
        c.n_shared_experts = r.get_non_negative("n_shared_experts", c.n_shared_experts);
        c.n_group = r.get_positive("n_group", c.n_group);
        c.topk_group = r.get_positive("topk_group", c.topk_group);
        c.route_scale = r.get("route_scale", c.route_scale);
        c.norm_topk_prob = r.get("norm_topk_prob", c.norm_topk_prob);
        c.router_weights_fp32 = r.get("router_weights_fp32", c.router_weights_fp32);
        c.expert_gate_cap = r.get("expert_gate_cap", c.expert_gate_cap);
        c.expert_up_cap = r.get("expert_up_cap", c.expert_up_cap);
        c.log_scaling_alpha = r.get("log_scaling_alpha", c.log_scaling_alpha);
        c.log_scaling_n_floor = r.get("log_scaling_n_floor", c.log_scaling_n_floor);  // null/absent: the preset's
        c.use_value_norm_no_gamma = r.get("use_value_norm_no_gamma", c.use_value_norm_no_gamma);
        c.use_attention_gate = r.get("use_attention_gate", c.use_attention_gate);
        c.l2_clip_radius_q = r.get("l2_clip_radius_q", c.l2_clip_radius_q);
        c.l2_clip_radius_k = r.get("l2_clip_radius_k", c.l2_clip_radius_k);
        c.l2_clip_radius_r = r.get("l2_clip_radius_r", c.l2_clip_radius_r);
        c.final_logit_softcapping = r.get("final_logit_softcapping", c.final_logit_softcapping);
        c.rms_norm_eps = r.get("rms_norm_eps", c.rms_norm_eps);
        c.init_std = r.get("init_std", c.init_std);
        r.check(c.init_std > 0, "init_std", "a positive number");
        r.check(c.rms_norm_eps > 0, "rms_norm_eps", "a positive number");
        r.check(c.route_scale > 0, "route_scale", "a positive number");
      });
}

}  // namespace atl
