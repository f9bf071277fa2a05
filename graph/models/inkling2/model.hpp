// Inkling2 text decoder (MODELS.md §1, §10.2): AttnRes depth mixing over an immutable residual
// state (completed blocks + partial), clipped Q/K/R attention with convolved K/V, relative logits
// and a query-conditioned sink, no RoPE; an MoE with an fp32 sigmoid router and interleaved capped
// SwiGLU experts; fp32 softcapped logits with an unused-vocabulary mask.
//
// Like Beam, the model is split into the pieces the actor runtime's ops run (embedding + embed_norm;
// per layer the attention depth mixes (attention_mix), the attention sublayer, the MLP depth mix
// (mlp_mix), then the MoE as router, dispatch, experts, combine; the final output_query mix + norm
// + head, and the loss); each piece's forward returns what its backward needs, so
// the reference trainer and the actor runtime share the math (graph/models/sublayer_run.hpp).
// Native names have no `model.` prefix (MODELS.md §10.2.10).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/models/family_model.hpp"
#include "graph/models/inkling2/config.hpp"
#include "graph/models/inkling2/parallelize.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/model.hpp"
#include "graph/models/sublayer_run.hpp"
#include "graph/models/token_context.hpp"
#include "graph/param.hpp"
#include "kernels/precision.hpp"

namespace atl {

// The depth state between layers (MODELS.md §1.3): tensors [T, H], T = B*S. Immutable: every
// layer returns a new state (tensors are shared, never written after they are made).
struct Inkling2ResidualState {
  std::vector<Tensor> completed;  // completed AttnRes blocks, oldest first
  Tensor partial;                 // the block being built (undefined only before a boundary commit)
  // The depth sources a mix sees: completed blocks in order, then the partial.
  std::vector<Tensor> sources() const;
};

// The tensors of a state, as the op graph's metas list them: completed blocks, then the partial.
inline std::vector<Tensor> state_tensors(const Inkling2ResidualState& state) { return state.sources(); }

// Gradient of the loss with respect to a residual state (same layout; undefined = zero).
struct Inkling2StateGrad {
  std::vector<Tensor> completed;
  Tensor partial;
};

struct Inkling2EmbedCache;  // activations each piece's backward needs (defined in caches.hpp)
struct Inkling2LayerCache;
struct Inkling2HeadCache;

// Islands: attn_query, mlp_query, output_query, q_l2_clip, rel_l2_clip, mlp.gate (MODELS.md §1.6);
// layers under "layers.", embed_tokens and embed_norm are embedding units, lm_head the (bulk) head.

class Inkling2Model : public FamilyModel<Inkling2Config> {
 public:
  using State = Inkling2ResidualState;
  using StateGrad = Inkling2StateGrad;
  using EmbedCache = Inkling2EmbedCache;
  using BlockCache = Inkling2LayerCache;
  using HeadCache = Inkling2HeadCache;
  // The AttnRes depth mixes before attention and before the MoE run as ops of their own
  // (attention_mix, mlp_mix: sublayer_run.hpp).
  static constexpr bool kResidualMixOps = true;

  explicit Inkling2Model(Inkling2Config config);

  // --- Model ---
  std::string family() const override { return "inkling2"; }
  FamilyShardingRules sharding_rules() const override { return inkling2_sharding_rules(); }
  std::vector<TensorMeta> pipeline_boundary(std::int64_t cut, std::int64_t rows, std::int64_t seq,
                                            Precision precision) const override {
    return inkling2_pipeline_boundary(config_, cut, rows, seq, precision);
  }

  // --- pieces (weights are compute weights: see compute_weights in graph/param.hpp) ---
  // embed_norm(embed_tokens(ids)) as the initial state: no completed blocks, the partial.
  Inkling2ResidualState embed_forward(const TensorMap& w, const Tensor& input_ids, const TokenContext& ctx,
                                      std::shared_ptr<Inkling2EmbedCache>* cache) const;
  void embed_backward(const TensorMap& w, const Inkling2EmbedCache& cache, const Inkling2StateGrad& d_state,
                      const TensorMap& grads) const;

  // A layer is two sublayers: attention (the depth mixes and norms, the boundary commit and
  // attention: the input state to the mid state), then the MoE around its MLP: the input maps the
  // mid state to the MoE input (MLP mix, mlp_norm), the output the MoE output m back into the state
  // (mlp_sconv, residual add). Each keeps what its backward needs in `cache`. The attention
  // sublayer is also two ops: the mix (attention_mix_*: the normed mixes attention reads, one on
  // local layers, q/k/v on full ones) and the core (attention_core_*: the rest).
  std::vector<Tensor> attention_mix_forward(std::int64_t layer, const TensorMap& w, const Inkling2ResidualState& state,
                                            const TokenContext& ctx, Inkling2LayerCache& cache) const;
  Inkling2ResidualState attention_core_forward(std::int64_t layer, const TensorMap& w,
                                               const Inkling2ResidualState& state, const TokenContext& ctx,
                                               Inkling2LayerCache& cache) const;
  // The core's backward: the input state's gradient through the residual paths; d_inputs gets
  // the gradients of the mixes' outputs.
  Inkling2StateGrad attention_core_backward(std::int64_t layer, const TensorMap& w, const Inkling2LayerCache& cache,
                                            const Inkling2StateGrad& d_mid, const TokenContext& ctx,
                                            const TensorMap& grads, std::vector<Tensor>& d_inputs) const;
  // d_residual (the core's) plus the mixes' share: the input state's gradient.
  Inkling2StateGrad attention_mix_backward(std::int64_t layer, const TensorMap& w, const Inkling2LayerCache& cache,
                                           const std::vector<Tensor>& d_inputs, const Inkling2StateGrad& d_residual,
                                           const TensorMap& grads) const;
  Inkling2ResidualState attention_sublayer_forward(std::int64_t layer, const TensorMap& w,
                                                   const Inkling2ResidualState& state, const TokenContext& ctx,
                                                   Inkling2LayerCache& cache) const;
  Inkling2StateGrad attention_sublayer_backward(std::int64_t layer, const TensorMap& w, const Inkling2LayerCache& cache,
                                                const Inkling2StateGrad& d_mid, const TokenContext& ctx,
                                                const TensorMap& grads) const;
  Tensor mlp_input_forward(std::int64_t layer, const TensorMap& w, const Inkling2ResidualState& mid,
                           const TokenContext& ctx, Inkling2LayerCache& cache) const;
  Inkling2ResidualState mlp_output_forward(std::int64_t layer, const TensorMap& w, const Tensor& m,
                                           const TokenContext& ctx, Inkling2LayerCache& cache) const;
  MlpOutputGrads<Inkling2StateGrad> mlp_output_backward(std::int64_t layer, const TensorMap& w,
                                                        const Inkling2LayerCache& cache, const Inkling2StateGrad& d_out,
                                                        const TokenContext& ctx, const TensorMap& grads) const;
  Inkling2StateGrad mlp_input_backward(std::int64_t layer, const TensorMap& w, const Inkling2LayerCache& cache,
                                       const Tensor& d_x, const Inkling2StateGrad& d_residual,
                                       const TensorMap& grads) const;
  MoeMlpSpec moe_spec() const;
  // The whole layer (both sublayers, the MoE in one piece), for tests of the architecture.
  Inkling2ResidualState layer_forward(std::int64_t layer, const TensorMap& w, const Inkling2ResidualState& state,
                                      const TokenContext& ctx, std::shared_ptr<Inkling2LayerCache>* cache) const;
  static Tensor routing_indices(const Inkling2LayerCache& cache);
  // The mixture weights of a layer's attention mixes (one [T, N] tensor per query; undefined at
  // layer 0) and of its MLP mix: for AttnRes invariants in tests.
  static std::vector<Tensor> attn_mix_weights(const Inkling2LayerCache& cache);
  static Tensor mlp_mix_weights(const Inkling2LayerCache& cache);

  // output_query mix, final norm, lm_head (fp32 accumulation, logits never rounded): the logits
  // f32 [T, V]. The loss op (lm_loss_forward with head_spec()) softcaps, masks the unused
  // vocabulary and takes the cross entropy.
  Tensor head_forward(const TensorMap& w, const Inkling2ResidualState& state, const TokenContext& ctx,
                      std::shared_ptr<Inkling2HeadCache>* cache) const;
  // d_logits -> the gradient of the final state.
  Inkling2StateGrad head_backward(const TensorMap& w, const Inkling2HeadCache& cache, const Tensor& d_logits,
                                  const TensorMap& grads) const;
  LmHeadSpec head_spec() const;

  nlohmann::json hf_fields() const override;
  TensorMap to_hf(const TensorMap& native) const override;
  TensorMap from_hf(const TensorMap& hf) const override;

  // Forward only (no caches kept); logits_out gets the fp32 logits [B, S, V] after softcap and mask.
  LossSum forward(const TensorMap& w, const Batch& batch, Precision precision,
                  Tensor* logits_out = nullptr) const override;

  // --- StagedModel: ops() = embed, per layer attention_mix, attention, mlp_mix, router, dispatch,
  // experts, combine; head, loss ---
  std::map<std::string, std::vector<TensorMeta>> activation_metas(std::int64_t rows, std::int64_t seq) const override;
  std::int64_t routed_experts() const override { return config_.n_routed_experts; }
  std::unique_ptr<MicroBatchRun> start(const Batch& micro_batch, Precision precision, float grad_scale) const override;

  static std::string layer_prefix(std::int64_t layer) { return "layers." + std::to_string(layer) + "."; }
};

}  // namespace atl
