// Inkling2's HF layout (MODELS.md §5.8, §10.2.10). No `model.` prefix. Every name equals the
// native one except:
//   - depth queries are single [H] vectors: native attn_query.weight [1, H] (local layers) <->
//     HF layers.L.attn_query.weight [H]; native [3, H] (full layers) <-> HF
//     layers.L.attn_query.{0,1,2}.weight [H]; native mlp_query.weight [1, H] <-> HF [H];
//     output_query.weight is [H] on both sides;
//   - experts: native gate_and_up_projs [E, H, 2I] (interleaved g0,u0,g1,u1,… columns) <-> HF
//     mlp.experts.gate_up_proj [E, 2I, H] (rows interleaved the same way), native down_projs
//     [E, I, H] <-> HF mlp.experts.down_proj [E, H, I]: a transpose, never a re-interleave.
// Orientation is told by the name, never by the shape (in the tiny preset H = 2I). Bytes are
// copied as they are, so dtypes are preserved and from_hf(to_hf(x)) == x bitwise.
#include <set>
#include <stdexcept>

#include "graph/models/hf_layout.hpp"
#include "graph/models/inkling2/model.hpp"

namespace atl {

namespace {
constexpr const char* kGateUp = "mlp.experts.gate_and_up_projs";
constexpr const char* kDown = "mlp.experts.down_projs";
constexpr const char* kHfGateUp = "mlp.experts.gate_up_proj";
constexpr const char* kHfDown = "mlp.experts.down_proj";
constexpr const char* kAttnQuery = "attn_query.weight";
constexpr const char* kMlpQuery = "mlp_query.weight";

std::string replace_tail(const std::string& s, const std::string& tail, const std::string& with) {
  return s.substr(0, s.size() - tail.size()) + with;
}

// HF names of a native [Q, H] query tensor: one [H] vector per row.
std::vector<std::string> hf_query_names(const std::string& native, std::int64_t rows) {
  if (rows == 1) return {native};
  std::vector<std::string> out;
  const std::string base = replace_tail(native, "weight", "");
  for (std::int64_t i = 0; i < rows; ++i) out.push_back(base + std::to_string(i) + ".weight");
  return out;
}

bool is_stacked_query(const std::string& name) { return name.ends_with(kAttnQuery) || name.ends_with(kMlpQuery); }
}  // namespace

nlohmann::json Inkling2Model::hf_fields() const {
  const auto& c = config_;
  return {{"architectures", {"Inkling2ForCausalLM"}},
          {"model_type", "inkling2"},
          {"vocab_size", c.vocab_size},
          {"unpadded_vocab_size", c.unpadded_vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"n_layers_per_attnres_block", c.n_layers_per_attnres_block},
          {"local_layer_ids", c.local_layer_ids},
          {"sliding_window_size", c.sliding_window_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"d_rel", c.d_rel},
          {"rel_extent", c.rel_extent},
          {"conv_kernel_size", c.conv_kernel_size},
          {"n_routed_experts", c.n_routed_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"moe_intermediate_size", c.moe_intermediate_size},
          {"n_shared_experts", c.n_shared_experts},
          {"n_group", c.n_group},
          {"topk_group", c.topk_group},
          {"route_scale", c.route_scale},
          {"norm_topk_prob", c.norm_topk_prob},
          {"scoring_func", "sigmoid"},
          {"expert_gate_cap", c.expert_gate_cap},
          {"expert_up_cap", c.expert_up_cap},
          {"log_scaling_alpha", c.log_scaling_alpha},
          {"log_scaling_n_floor",
           c.log_scaling_n_floor > 0 ? nlohmann::json(c.log_scaling_n_floor) : nlohmann::json(nullptr)},
          {"use_value_norm_no_gamma", c.use_value_norm_no_gamma},
          {"use_attention_gate", c.use_attention_gate},
          {"l2_clip_radius_q", c.radius_q()},
          {"l2_clip_radius_k", c.radius_k()},
          {"l2_clip_radius_r", c.radius_r()},
          {"final_logit_softcapping", softcap_field(c.final_logit_softcapping)},
          {"rms_norm_eps", c.rms_norm_eps},
          {"initializer_range", c.init_std},
          {"router_weights_fp32", c.router_weights_fp32},  // numerics of bf16 runs: part of the model
          {"tie_word_embeddings", false},
          {"atoll_preset", c.preset}};
}

TensorMap Inkling2Model::to_hf(const TensorMap& native) const {
  TensorMap hf;
  for (const auto& s : specs_) {
    const Tensor& t = native.at(s.name);
    if (t.shape() != s.shape) {
      throw std::invalid_argument("Inkling2 to_hf: '" + s.name + "' is " + t.describe() + ", expected " +
                                  shape_string(s.shape));
    }
    if (s.name.ends_with(kGateUp)) {
      hf.insert(replace_tail(s.name, kGateUp, kHfGateUp), transpose_last_two(t));
    } else if (s.name.ends_with(kDown)) {
      hf.insert(replace_tail(s.name, kDown, kHfDown), transpose_last_two(t));
    } else if (is_stacked_query(s.name)) {
      const std::vector<Tensor> rows = unstack(t);
      const std::vector<std::string> names = hf_query_names(s.name, s.shape[0]);
      for (std::size_t i = 0; i < rows.size(); ++i) hf.insert(names[i], rows[i]);
    } else {
      hf.insert(s.name, t.clone());
    }
  }
  return hf;
}

TensorMap Inkling2Model::from_hf(const TensorMap& hf) const {
  TensorMap native;
  std::set<std::string> used;
  auto take = [&](const std::string& name, const Shape& shape) -> const Tensor& {
    used.insert(name);
    return require_hf_tensor(hf, name, shape);
  };
  for (const auto& s : specs_) {
    if (s.name.ends_with(kGateUp) || s.name.ends_with(kDown)) {
      const bool gate_up = s.name.ends_with(kGateUp);
      const std::string name =
          gate_up ? replace_tail(s.name, kGateUp, kHfGateUp) : replace_tail(s.name, kDown, kHfDown);
      native.insert(s.name, transpose_last_two(take(name, {s.shape[0], s.shape[2], s.shape[1]})));
    } else if (is_stacked_query(s.name)) {
      std::vector<Tensor> rows;
      for (const auto& name : hf_query_names(s.name, s.shape[0])) rows.push_back(take(name, {s.shape[1]}));
      native.insert(s.name, stack(rows));
    } else {
      native.insert(s.name, take(s.name, s.shape).clone());
    }
  }
  for (const auto& name : hf.names()) {
    if (!used.count(name)) throw std::invalid_argument("HF state dict: unexpected tensor '" + name + "' for Inkling2");
  }
  return native;
}

}  // namespace atl
