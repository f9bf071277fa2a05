// Flint (MODELS.md §2, §10.3): pre-norm decoder with two residuals; GQA attention with per-head
// q/k norms, RoPE on sliding layers only (full layers are NoPE) and a learned fp32 sink per head on
// every layer; dense SwiGLU MLPs on mlp_only_layers, elsewhere an MoE with a softmax-over-E router
// (logits in fp32), routing weights applied after the down projection and an ungated shared
// expert; an fp32 lm_head island without softcap.
//
// The model is split into the pieces FSDP units run (embedding, one block per layer, head); each
// piece has a forward that returns what its backward needs, so the reference trainer and the
// actor runtime drive the same math.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/models/flint/config.hpp"
#include "graph/models/flint/parallelize.hpp"
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

struct FlintBlockCache;  // activations a block's backward needs (defined in block_cache.hpp)

// fp32 islands: the sink holders `self_attn._fp32_params` (one unit per layer) and `lm_head`,
// which is also the head unit and takes the island policy (MODELS.md §2.3, §5.3).

class FlintModel : public HiddenStateModel<FlintModel, FlintConfig> {
 public:
  using BlockCache = FlintBlockCache;

  explicit FlintModel(FlintConfig config);

  // --- Model ---
  std::string family() const override { return "flint"; }
  FamilyShardingRules sharding_rules() const override { return flint_sharding_rules(); }
  std::vector<TensorMeta> pipeline_boundary(std::int64_t /*cut*/, std::int64_t rows, std::int64_t seq,
                                            Precision precision) const override {
    return flint_pipeline_boundary(config_, rows, seq, precision);
  }

  // --- pieces (weights are compute weights: see compute_weights in graph/param.hpp) ---
  // (The embedding and the head's forward and backward are HiddenStateModel's.)

  // A block is two sublayers (two ops of the runtime): the attention sublayer maps the block input
  // to h_mid, the MLP sublayer h_mid to the block output; both keep what backward needs in `cache`.
  Tensor attention_sublayer_forward(std::int64_t layer, const TensorMap& w, const Tensor& hidden,
                                    const TokenContext& ctx, FlintBlockCache& cache) const;
  Tensor attention_sublayer_backward(std::int64_t layer, const TensorMap& w, const FlintBlockCache& cache,
                                     const Tensor& d_h_mid, const TokenContext& ctx, const TensorMap& grads) const;
  // The MLP sublayer around its MLP (MoE or dense; sublayer_run.hpp runs the whole): the
  // input maps h_mid to the MLP input (post-attention norm), the output adds the residual.
  Tensor mlp_input_forward(std::int64_t layer, const TensorMap& w, const Tensor& h_mid, const TokenContext& ctx,
                           FlintBlockCache& cache) const;
  Tensor mlp_output_forward(std::int64_t layer, const TensorMap& w, const Tensor& m, const TokenContext& ctx,
                            FlintBlockCache& cache) const;
  MlpOutputGrads<Tensor> mlp_output_backward(std::int64_t layer, const TensorMap& w, const FlintBlockCache& cache,
                                             const Tensor& d_out, const TokenContext& ctx,
                                             const TensorMap& grads) const;
  Tensor mlp_input_backward(std::int64_t layer, const TensorMap& w, const FlintBlockCache& cache, const Tensor& d_x2,
                            const Tensor& d_residual, const TensorMap& grads) const;
  MoeMlpSpec moe_spec() const;
  // Router choices of a sparse block from its cache (undefined tensor for dense blocks).
  static Tensor routing_indices(const FlintBlockCache& cache);

  // The final norm and the fp32 lm_head island: logits never rounded; the loss op
  // (lm_loss_forward) masks the vocabulary, no softcap, cross entropy.
  LmHeadSpec head_spec() const;

  // HF layout (MODELS.md §10.3, state_dict_adapter.cpp): sinks are `self_attn.softmax_offset`,
  // the shared expert is `mlp.shared_expert.*`, experts are per expert; all else keeps its name.
  nlohmann::json hf_fields() const override;
  TensorMap to_hf(const TensorMap& native) const override;
  TensorMap from_hf(const TensorMap& hf) const override;

  // Forward only (no caches kept); logits_out gets the fp32 logits [B, S, V] after the mask.
  LossSum forward(const TensorMap& w, const Batch& batch, Precision precision,
                  Tensor* logits_out = nullptr) const override;

  // --- StagedModel: ops() = embed, per layer attention + (mlp | router, dispatch, experts, combine), head ---
  std::int64_t routed_experts() const override { return config_.num_experts; }
  std::unique_ptr<MicroBatchRun> start(const Batch& micro_batch, Precision precision, float grad_scale) const override;

 private:
  GqaAttentionSpec attention_spec(std::int64_t layer) const;
};

}  // namespace atl
