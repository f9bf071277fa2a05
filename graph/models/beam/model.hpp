// Beam (MODELS.md §3, §10.4): pre-norm decoder with sandwich norms, depth-scaled residuals,
// sliding (RoPE) and full (NoPE + SSMax) GQA attention with a sigmoid output gate, dense SwiGLU
// or MoE MLPs with an fp32 grouped sigmoid router, fp32 softcapped logits.
//
// The model is split into the pieces FSDP units run (embedding, one block per layer, head);
// each piece has a forward that returns what its backward needs, so the reference trainer and
// the actor runtime drive the same math.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/models/beam/config.hpp"
#include "graph/models/beam/parallelize.hpp"
#include "graph/models/gqa_attention.hpp"
#include "graph/models/hidden_state_model.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/model.hpp"
#include "graph/models/moe_mlp.hpp"
#include "graph/models/sublayer_run.hpp"
#include "graph/models/token_context.hpp"
#include "graph/param.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct BeamBlockCache;  // activations a block's backward needs (defined in block_cache.hpp)

class BeamModel : public HiddenStateModel<BeamModel, BeamConfig> {
 public:
  using BlockCache = BeamBlockCache;

  explicit BeamModel(BeamConfig config);

  // --- Model ---
  std::string family() const override { return "beam"; }
  FamilyShardingRules sharding_rules() const override { return beam_sharding_rules(); }
  std::vector<TensorMeta> pipeline_boundary(std::int64_t /*cut*/, std::int64_t rows, std::int64_t seq,
                                            Precision precision) const override {
    return beam_pipeline_boundary(config_, rows, seq, precision);
  }

  // --- pieces (weights are compute weights: see compute_weights in graph/param.hpp) ---
  // (The embedding and the head's forward and backward are HiddenStateModel's.)

  // A block is two sublayers (two ops of the runtime): the attention sublayer maps the block input
  // to h_mid, the MLP sublayer h_mid to the block output; both keep what backward needs in `cache`.
  Tensor attention_sublayer_forward(std::int64_t layer, const TensorMap& w, const Tensor& hidden,
                                    const TokenContext& ctx, BeamBlockCache& cache) const;
  Tensor attention_sublayer_backward(std::int64_t layer, const TensorMap& w, const BeamBlockCache& cache,
                                     const Tensor& d_h_mid, const TokenContext& ctx, const TensorMap& grads) const;
  // The MLP sublayer around its MLP (MoE or dense; sublayer_run.hpp runs the whole): the
  // input maps h_mid to the MLP input (pre-feedforward norm), the output the MLP output m to the
  // block output (post-feedforward norm, depth-scaled residual with h_mid).
  Tensor mlp_input_forward(std::int64_t layer, const TensorMap& w, const Tensor& h_mid, const TokenContext& ctx,
                           BeamBlockCache& cache) const;
  Tensor mlp_output_forward(std::int64_t layer, const TensorMap& w, const Tensor& m, const TokenContext& ctx,
                            BeamBlockCache& cache) const;
  MlpOutputGrads<Tensor> mlp_output_backward(std::int64_t layer, const TensorMap& w, const BeamBlockCache& cache,
                                             const Tensor& d_out, const TokenContext& ctx,
                                             const TensorMap& grads) const;
  Tensor mlp_input_backward(std::int64_t layer, const TensorMap& w, const BeamBlockCache& cache, const Tensor& d_x2,
                            const Tensor& d_residual, const TensorMap& grads) const;
  MoeMlpSpec moe_spec() const;
  // Router choices of a sparse block from its cache (undefined tensor for dense blocks).
  static Tensor routing_indices(const BeamBlockCache& cache);

  // The final norm and the bulk lm_head: logits rounded to bf16 in bf16, then softcapped by the
  // loss op (lm_loss_forward), which also masks the vocabulary.
  LmHeadSpec head_spec() const;

  nlohmann::json hf_fields() const override;
  TensorMap to_hf(const TensorMap& native) const override;
  TensorMap from_hf(const TensorMap& hf) const override;

  // Forward only (no caches kept); logits_out gets the fp32 logits [B, S, V] after softcap and mask.
  LossSum forward(const TensorMap& w, const Batch& batch, Precision precision,
                  Tensor* logits_out = nullptr) const override;

  // --- StagedModel: ops() = embed, per layer attention + (mlp | router, dispatch, experts, combine), head ---
  std::int64_t routed_experts() const override { return config_.n_routed_experts; }
  std::unique_ptr<MicroBatchRun> start(const Batch& micro_batch, Precision precision, float grad_scale) const override;

 private:
  GqaAttentionSpec attention_spec(std::int64_t layer) const;
};

}  // namespace atl
