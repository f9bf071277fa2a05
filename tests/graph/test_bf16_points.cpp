// MODELS.md §10.1.12 (binding): in precision bf16 every emulation point holds bf16 values
// (round_to_bf16(x) == x for each element, kernels/dtype.hpp), and the quantities that stay fp32
// (AttnRes weights, router logits and scores, softmaxes, softcap, unrounded logits) are not
// rounded. The same pieces in precision fp32 show that the bf16 run's values are the precision's
// doing, not the data's: there the emulation points are not bf16 values either.
//
// Every piece runs as the runtime runs it, and the points are read from the caches the pieces keep
// for backward (graph/models/*/block_cache.hpp, inkling2/caches.hpp): Inkling2 through
// embed_forward, layer_forward (and once more through its pieces, checked bitwise against it),
// head_forward and the loss op; Beam and Flint through the embedding, every block's sublayers
// (the MoE steps and the dense MLP with the model's spec), the head and the loss op. For every
// family the logits the loss op saw equal the model's own forward's, bit for bit, so the pieces
// checked are the ones training runs. What stays out of reach: attention probabilities (the
// kernels keep only the log-sum-exp, checked fp32) and the convolutions' outputs that are added
// to a residual at once (the sum is checked).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <memory>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/models/beam/block_cache.hpp"
#include "graph/models/beam/model.hpp"
#include "graph/models/beam/model_config.hpp"
#include "graph/models/dense_mlp.hpp"
#include "graph/models/flint/block_cache.hpp"
#include "graph/models/flint/model.hpp"
#include "graph/models/flint/model_config.hpp"
#include "graph/models/inkling2/caches.hpp"
#include "graph/models/inkling2/model.hpp"
#include "graph/models/inkling2/model_config.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/moe_mlp.hpp"
#include "graph/param.hpp"
#include "kernels/dtype.hpp"
#include "kernels/precision.hpp"
#include "kernels/rng.hpp"
#include "tests/graph/beam_test_support.hpp"
#include "tests/graph/checkpoint_test_support.hpp"

using namespace atl;
using checkpoint_testing::same_bits;

namespace {

struct Point {
  std::string name;
  Tensor t;
};

// The tensors one forward produced: the §10.1.12 emulation points, and what stays fp32.
struct Points {
  std::vector<Point> rounded;
  std::vector<Point> fp32;
  void round(const std::string& name, const Tensor& t) { rounded.push_back({name, t}); }
  void keep(const std::string& name, const Tensor& t) { fp32.push_back({name, t}); }
};

// Elements of an f32 tensor that bf16 cannot hold. NaN is never a bf16 value (NaN != NaN); with
// skip_nan it is not counted (an fp32 quantity must show a real unrounded value).
struct Scan {
  std::int64_t count = 0;
  std::int64_t first = -1;
  float value = 0;
};
Scan not_bf16(const Tensor& t, bool skip_nan) {
  Scan s;
  const float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (skip_nan && std::isnan(p[i])) continue;
    if (round_to_bf16(p[i]) != p[i]) {
      if (s.count == 0) {
        s.first = i;
        s.value = p[i];
      }
      ++s.count;
    }
  }
  return s;
}

// The point's tensor, checked to be a defined f32 tensor (else false, the failure said).
bool scannable(const Point& p) {
  if (!p.t.defined()) {
    FAIL_CHECK("the tensor is undefined");
    return false;
  }
  REQUIRE(p.t.dtype() == DType::f32);
  return true;
}

// bf16: every emulation point is all bf16 values. fp32: every emulation point has a value bf16
// cannot hold. Both: every fp32 quantity has a value bf16 cannot hold.
void check_points(const Points& pts, Precision prec) {
  for (const Point& p : pts.rounded) {
    INFO("precision " << precision_name(prec) << ", emulation point (MODELS.md 10.1.12): " << p.name);
    if (!scannable(p)) continue;
    CHECK(p.t.numel() > 0);
    const Scan s = not_bf16(p.t, prec == Precision::fp32);
    INFO(p.t.describe() << ": " << s.count << " elements are not bf16 values, the first at flat index " << s.first
                        << " = " << std::setprecision(9) << s.value);
    if (prec == Precision::bf16) {
      CHECK(s.count == 0);
    } else {
      CHECK(s.count > 0);  // not rounded in fp32: the bf16 run's rounding is the precision's doing
    }
  }
  for (const Point& p : pts.fp32) {
    INFO("precision " << precision_name(prec) << ", stays fp32 (MODELS.md 10.1.12): " << p.name);
    if (!scannable(p)) continue;
    const Scan s = not_bf16(p.t, true);
    INFO(p.t.describe() << ": " << s.count << " of " << p.t.numel() << " elements are not bf16 values");
    CHECK(s.count > 0);  // a rounding here would make every element a bf16 value
  }
}

// Master weights: the init, with every ones/zeros parameter (gammas, clip scales, depth queries,
// biases, sinks) perturbed so that no value is a bf16 value by construction and the AttnRes mixes
// are not uniform (zero queries give weights 1/N, which is a bf16 value for N = 2).
TensorMap master_weights(const std::vector<ParamSpec>& specs, std::uint64_t seed) {
  TensorMap w = TensorMap::initialized(specs, seed, 0.02f);
  for (const auto& s : specs) {
    if (s.init == Init::normal) continue;
    CounterRng rng(seed + 1, s.name);
    float* p = w.at(s.name).data<float>();
    const double scale = s.name.ends_with("query.weight") ? 0.5 : 0.1;
    for (std::int64_t i = 0; i < s.numel(); ++i) p[i] += static_cast<float>(scale * rng.normal(i));
  }
  return w;
}

// The MoE steps the runtime's ops run (route, dispatch, shared, experts, combine) with a model's
// spec on the MLP input x of the layer under `prefix`; returns the MoE output.
Tensor moe_points(const std::string& prefix, const TensorMap& w, const Tensor& x, const Tensor& token_mask,
                  const MoeMlpSpec& spec, Precision prec, Points& pts) {
  MoeMlpCache moe;
  moe_route_forward(prefix, w, x, token_mask, spec, prec, moe);
  pts.keep(prefix + "mlp.gate router logits", moe.router_logits);
  pts.keep(prefix + "mlp.gate router scores (over all E)", moe.routing.scores);
  if (spec.router.router_weights_fp32) {
    pts.keep(prefix + "routing weights (router_weights_fp32)", moe.routing.weights);
  } else {
    pts.round(prefix + "routing weights", moe.routing.weights);
  }
  moe_dispatch_forward(moe);
  if (spec.shared_expert()) {
    moe_shared_forward(prefix, w, prec, moe);
    pts.round(prefix + "mlp.shared_experts gate_proj output", moe.sg);
    pts.round(prefix + "mlp.shared_experts up_proj output", moe.su);
    pts.round(prefix + "mlp.shared_experts SwiGLU activation", moe.sact);
    pts.round(prefix + "mlp.shared_experts down_proj output", moe.shared_out);
  }
  moe_experts_forward(prefix, w, spec, prec, moe);
  pts.round(prefix + "mlp.experts gate_up output", moe.experts.gate_up_out);
  pts.round(prefix + "mlp.experts GLU activation", moe.experts.act_out);
  pts.round(prefix + "mlp.experts down output", moe.experts.down_out);
  const Tensor m = moe_combine_forward(spec, prec, moe);
  pts.round(prefix + "combined expert output (MoE output)", m);
  return m;
}

// The dense MLP of the layer under `prefix` on x; returns its output.
Tensor dense_points(const std::string& prefix, const TensorMap& w, const Tensor& x, Precision prec, Points& pts) {
  DenseMlpCache dense;
  const Tensor out = dense_mlp_forward(prefix, w, x, prec, dense);
  pts.round(prefix + "mlp.gate_proj output", dense.g);
  pts.round(prefix + "mlp.up_proj output", dense.u);
  pts.round(prefix + "mlp SwiGLU activation", dense.act);
  pts.round(prefix + "mlp.down_proj output", out);
  return out;
}

// The GQA attention of Beam and Flint (graph/models/gqa_attention.cpp) from its cache.
void gqa_points(const std::string& prefix, const GqaAttentionCache& a, Points& pts) {
  pts.round(prefix + "self_attn.q_proj output", a.q_lin);
  pts.round(prefix + "self_attn.k_proj output", a.k_lin);
  pts.round(prefix + "self_attn.v_proj output", a.v);
  pts.round(prefix + "self_attn.q_norm output", a.q_norm.y);
  pts.round(prefix + "self_attn.k_norm output", a.k_norm.y);
  pts.round(prefix + "q the attention reads (after RoPE or SSMax)", a.q_att);
  pts.round(prefix + "k the attention reads (after RoPE)", a.k_att);
  pts.keep(prefix + "attention log-sum-exp (the softmax's normaliser)", a.attention.lse);
  pts.round(prefix + "attention output (before the output projection)", a.out);
}

// The loss op on the head's logits: the softcapped logits (fp32 cap, mask) and the CE softmax.
// Returns the logits the loss sees, [B, S, V].
Tensor loss_points(const LmHeadSpec& spec, const Tensor& logits, const Batch& batch, const TokenContext& ctx,
                   Points& pts) {
  LmLossCache loss;
  Tensor capped;
  lm_loss_forward(spec, logits, batch.targets, ctx, loss, &capped);
  if (spec.softcap > 0) pts.keep("softcapped logits (loss op)", capped);
  pts.keep("cross-entropy softmax probabilities (loss op)", loss.loss.probs);
  return capped;
}

// The pieces are the model: its own forward gives the logits the loss saw, bit for bit.
template <class Model>
void check_same_as_forward(const Model& model, const TensorMap& w, const Batch& batch, Precision prec,
                           const Tensor& loss_logits) {
  Tensor forward_logits;
  model.forward(w, batch, prec, &forward_logits);
  CHECK(same_bits(forward_logits, loss_logits));
}

// ------------------------------------------------------------------------------------------------
// Inkling2

ModelSection section(const std::string& family, const std::string& preset, const std::string& yaml) {
  ModelSection s;
  s.family = family;
  s.preset = preset;
  s.overrides = YAML::Load(yaml);
  return s;
}

// One layer's AttnRes mixes and attention (MODELS.md §10.2.1 order) from its cache.
void inkling2_attention_points(const std::string& p, const Inkling2LayerCache& k, bool full, Points& pts) {
  for (std::size_t i = 0; i < k.attn_mix.size(); ++i) {
    pts.round(p + "attention AttnRes mix " + std::to_string(i) + " output", k.attn_mix[i].out);
  }
  pts.round(p + "MLP AttnRes mix output", k.mlp_mix.out);
  const Inkling2AttnCache& a = k.attn;
  pts.round(p + "qkvr q block", a.q_lin);
  pts.round(p + "qkvr k block", a.k_lin);
  pts.round(p + "qkvr v block", a.v_lin);
  pts.round(p + "qkvr r block", a.r_lin);
  if (full) {
    pts.round(p + "dynamic k conv taps (a bulk linear output)", a.k_taps);
    pts.round(p + "dynamic v conv taps (a bulk linear output)", a.v_taps);
  }
  pts.round(p + "k short conv output", a.k_conv);
  pts.round(p + "v short conv output", a.v_conv);
  pts.round(p + "q L2 clip output", a.q_clip.y);
  pts.round(p + "k L2 clip output", a.k_clip.y);
  pts.round(p + "r L2 clip output", a.r_clip.y);
  pts.keep(p + "q L2 clip norms", a.q_clip.norms);
  pts.keep(p + "k L2 clip norms", a.k_clip.norms);
  pts.keep(p + "r L2 clip norms", a.r_clip.norms);
  if (a.v_norm.y.defined()) pts.round(p + "value norm output", a.v_norm.y);
  pts.round(p + "relative profiles and sink logit (r @ relative_table)", a.rel);
  pts.round(p + "relative profiles the attention reads", a.profiles);
  pts.round(p + "sink logits the attention reads", a.sinks);
  pts.round(p + "q the attention reads", a.q_att);
  pts.keep(p + "attention log-sum-exp (with the sink)", a.attn.lse);
  pts.round(p + "attention output", a.o);
  if (a.gated.defined()) {
    pts.round(p + "attention gate projection output", a.gate_lin);
    pts.round(p + "gated attention output (wo_ud input)", a.gated);
  }
  pts.round(p + "wo_ud output", a.a_lin);
}

// Embedding, every layer and the head of an Inkling2 model on `batch`.
Points inkling2_points(const Inkling2Model& model, const TensorMap& master, const Batch& batch, Precision prec) {
  const Inkling2Config& c = model.config();
  const TensorMap w = compute_weights(model.specs(), master, prec);
  const TokenContext ctx{batch.positions, batch.valid, batch.rows(), batch.seq_len(), prec};
  const Tensor token_mask = batch.valid.reshape({ctx.tokens()});
  Points pts;
  Inkling2ResidualState state = model.embed_forward(w, batch.input_ids, ctx, nullptr);
  pts.round("embed_norm output (the initial partial)", state.partial);
  const char* input_names[] = {"attn_norms.0 output (xq)", "attn_norms.1 output (xk)", "attn_norms.2 output (xv)"};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = Inkling2Model::layer_prefix(l);
    INFO("layer " << l << (c.is_local(l) ? " (local)" : " (full)"));
    std::shared_ptr<Inkling2LayerCache> cache;
    const Inkling2ResidualState out = model.layer_forward(l, w, state, ctx, &cache);
    REQUIRE(cache);
    // The AttnRes weights (fp32): undefined for a mix of one source (layer 0's attention mixes).
    const std::vector<Tensor> attn_mix = Inkling2Model::attn_mix_weights(*cache);
    for (std::size_t i = 0; i < attn_mix.size(); ++i) {
      if (attn_mix[i].defined()) pts.keep(p + "attn_query." + std::to_string(i) + " AttnRes weights", attn_mix[i]);
    }
    if (l > 0) CHECK(attn_mix.at(0).defined());
    pts.keep(p + "mlp_query AttnRes weights", Inkling2Model::mlp_mix_weights(*cache));
    inkling2_attention_points(p, *cache, !c.is_local(l), pts);

    // The layer's pieces once more, to see the tensors between them, on a fresh cache.
    // attention_mix_forward returns the normed mixes.
    const auto scratch = std::make_shared<Inkling2LayerCache>();
    const std::vector<Tensor> inputs = model.attention_mix_forward(l, w, state, ctx, *scratch);
    const std::size_t n_in = static_cast<std::size_t>(c.attn_norm_count(l));
    REQUIRE(inputs.size() >= n_in);
    for (std::size_t i = 0; i < n_in; ++i) pts.round(p + input_names[i], inputs[inputs.size() - n_in + i]);
    const Inkling2ResidualState mid = model.attention_core_forward(l, w, state, ctx, *scratch);
    // At a boundary the partial restarts: the mid partial is attn_sconv's output itself.
    pts.round(p + (c.is_boundary(l) ? "attn_sconv output (the mid partial, a new block)"
                                    : "attention residual add (the mid partial)"),
              mid.partial);
    const Tensor x = model.mlp_input_forward(l, w, mid, ctx, *scratch);
    pts.round(p + "mlp_norm output (the MoE input)", x);
    const Tensor m = moe_points(p, w, x, token_mask, model.moe_spec(), prec, pts);
    const Inkling2ResidualState piecewise = model.mlp_output_forward(l, w, m, ctx, *scratch);
    pts.round(p + "MLP residual add (the layer's output partial)", out.partial);
    // The pieces are the layer.
    CHECK(same_bits(piecewise.partial, out.partial));
    REQUIRE(piecewise.completed.size() == out.completed.size());
    for (std::size_t b = 0; b < out.completed.size(); ++b) CHECK(same_bits(piecewise.completed[b], out.completed[b]));
    state = out;
  }
  // lm_head is bulk but its logits are never rounded (MODELS.md §10.2.8).
  const Tensor logits = model.head_forward(w, state, ctx, nullptr);
  pts.keep("lm_head logits (never rounded, MODELS.md 10.2.8)", logits);
  check_same_as_forward(model, w, batch, prec, loss_points(model.head_spec(), logits, batch, ctx, pts));
  return pts;
}

void check_inkling2(const Inkling2Config& config) {
  const Inkling2Model model(config);
  const TensorMap master = master_weights(model.specs(), 21);
  const Batch batch = testing::synthetic_batch(2, 32, 9);  // packed rows: several documents each
  for (Precision prec : {Precision::bf16, Precision::fp32}) {
    INFO("precision " << precision_name(prec));
    const Points pts = inkling2_points(model, master, batch, prec);
    check_points(pts, prec);
  }
}

}  // namespace

TEST_CASE("bf16 emulation points of inkling2-tiny hold bf16 values and the fp32 quantities are not rounded",
          "[inkling2][bf16][precision]") {
  const Inkling2Config c = inkling2_config_from(section("inkling2", "inkling2-tiny", "{}"), "test_bf16_points.yaml");
  REQUIRE(c.is_local(0));
  REQUIRE_FALSE(c.is_local(3));
  check_inkling2(c);
}

TEST_CASE("bf16 emulation points of Inkling2 with a full layer 0 and gate and value norm and log scaling",
          "[inkling2][bf16][precision]") {
  const Inkling2Config c =
      inkling2_config_from(section("inkling2", "inkling2-tiny",
                                   "{local_layer_ids: [1, 2], use_attention_gate: true, use_value_norm_no_gamma: true, "
                                   "log_scaling_n_floor: 4}"),
                           "test_bf16_points.yaml");
  REQUIRE_FALSE(c.is_local(0));
  REQUIRE(c.use_attention_gate);
  REQUIRE(c.use_value_norm_no_gamma);
  REQUIRE(c.log_scaling_n_floor > 0);
  check_inkling2(c);
}

// ------------------------------------------------------------------------------------------------
// Beam and Flint: the embedding, every block (both sublayers, from the block cache), the head and
// the loss op; `block_extra` adds the family's own points from the block cache.

namespace {

template <class Model, class BlockExtra>
void check_model_points(const Model& model, std::uint32_t seed, bool head_rounded, const BlockExtra& block_extra) {
  const auto& c = model.config();
  const TensorMap master = master_weights(model.specs(), seed);
  const Batch batch = testing::synthetic_batch(2, 32, seed);
  for (Precision prec : {Precision::bf16, Precision::fp32}) {
    INFO("precision " << precision_name(prec));
    const TensorMap w = compute_weights(model.specs(), master, prec);
    const TokenContext ctx{batch.positions, batch.valid, batch.rows(), batch.seq_len(), prec};
    const Tensor token_mask = batch.valid.reshape({ctx.tokens()});
    Points pts;
    Tensor hidden = model.embed_forward(w, batch.input_ids, ctx, nullptr);
    pts.round("embedding lookup", hidden);
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = Model::layer_prefix(l);
      typename Model::BlockCache k;
      const Tensor h_mid = model.attention_sublayer_forward(l, w, hidden, ctx, k);
      pts.round(p + "input_layernorm output", k.ln_in.y);
      gqa_points(p, k.attn, pts);
      pts.round(p + "self_attn.o_proj output", k.a_lin);
      pts.round(p + "attention residual add", h_mid);
      const Tensor x = model.mlp_input_forward(l, w, h_mid, ctx, k);
      pts.round(p + "MLP input norm output", x);
      const Tensor m = c.is_sparse(l) ? moe_points(p, w, x, token_mask, model.moe_spec(), prec, pts)
                                      : dense_points(p, w, x, prec, pts);
      hidden = model.mlp_output_forward(l, w, m, ctx, k);
      pts.round(p + "MLP residual add (the block output)", hidden);
      block_extra(p, k, pts);
    }
    std::shared_ptr<LmHeadCache> head;
    const Tensor logits = model.head_forward(w, hidden, ctx, &head);
    REQUIRE(head);
    pts.round("model.norm output", head->norm.y);
    if (head_rounded) {
      pts.round("lm_head logits (bulk head, rounded before the softcap, MODELS.md 10.4.5)", logits);
    } else {
      pts.keep("lm_head logits (fp32 island head, MODELS.md 10.3.4)", logits);
    }
    check_same_as_forward(model, w, batch, prec, loss_points(model.head_spec(), logits, batch, ctx, pts));
    check_points(pts, prec);
  }
}

void beam_block_points(const std::string& p, const BeamBlockCache& k, Points& pts) {
  pts.round(p + "self_attn.output_gate_proj output", k.gate_lin);
  pts.round(p + "gated attention output (o_proj input)", k.gated);
  pts.round(p + "post_attention_layernorm output", k.ln_post_attn.y);
  pts.round(p + "post_feedforward_layernorm output", k.ln_post_ff.y);
}

}  // namespace

TEST_CASE("bf16 emulation points of beam-tiny-moe with a shared expert hold bf16 values", "[beam][bf16][precision]") {
  const BeamModel model(
      beam_config_from(section("beam", "beam-tiny-moe", "{n_shared_experts: 1}"), "test_bf16_points.yaml"));
  REQUIRE(model.moe_spec().shared_expert());
  REQUIRE(model.config().is_sliding(0));
  REQUIRE_FALSE(model.config().is_sliding(3));  // a full layer: NoPE with SSMax
  check_model_points(model, 31, true, beam_block_points);
}

TEST_CASE("bf16 emulation points of beam-tiny-dense hold bf16 values", "[beam][bf16][precision]") {
  const BeamModel model(beam_config_from(section("beam", "beam-tiny-dense", "{}"), "test_bf16_points.yaml"));
  REQUIRE_FALSE(model.config().is_sparse(0));
  check_model_points(model, 41, true, beam_block_points);
}

TEST_CASE("bf16 emulation points of flint-tiny hold bf16 values", "[flint][bf16][precision]") {
  const FlintModel model(flint_config_from(section("flint", "flint-tiny", "{}"), "test_bf16_points.yaml"));
  REQUIRE_FALSE(model.config().is_sparse(0));  // a dense layer and sparse ones with the shared expert
  REQUIRE(model.config().is_sparse(2));
  REQUIRE(model.moe_spec().shared_expert());
  check_model_points(model, 51, false, [](const std::string&, const FlintBlockCache&, Points&) {});
}
