// The MoE MLP of all three families (MODELS.md §0.5): router -> dispatch -> experts -> combine,
// plus an optional ungated-sum shared expert. Parameters under `<layer prefix>mlp.`: gate.weight
// (the router, fp32 logits), gate.e_score_correction_bias (when the family has one),
// experts.gate_and_up_projs [E,H,2I], experts.down_projs [E,I,H], and shared_experts.{gate,up,
// down}_proj.weight when there is a shared expert. Dispatch and combine are separate steps here:
// they are where expert parallelism puts its all-to-alls (the experts in between run on their
// owner, indexed by local id with an offset).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "graph/param.hpp"
#include "graph/training/staged_model.hpp"
#include "kernels/ops/experts.hpp"
#include "kernels/ops/router.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct MoeMlpSpec {
  RouterConfig router;
  ExpertsConfig experts;  // precision is set per call
  bool correction_bias = false;  // the router adds mlp.gate.e_score_correction_bias for selection
  // mlp.shared_experts.* of this width (0: none): SwiGLU on every token, added with weight 1.
  std::int64_t shared_width = 0;
  bool shared_expert() const { return shared_width > 0; }
};

// Appends the parameters above for a layer: E = spec.router.num_experts experts of width I on
// hidden size H; the router (with the correction bias an fp32 island) is an island unless
// `router_island` is false (Flint's is bulk); the shared expert if the spec has one. Their order
// is the checkpoint's.
void append_moe_mlp_specs(std::vector<ParamSpec>& specs, const std::string& layer_prefix, const MoeMlpSpec& spec,
                          std::int64_t H, std::int64_t I, bool router_island);

struct MoeMlpCache {
  // forward
  Tensor x;              // f32 [T,H] the MLP input
  Tensor router_logits;  // f32 [T,E]
  RouterForward routing;
  ExpertDispatch dispatch;
  DispatchedRows rows;  // the dispatched token rows (what an all-to-all would send to the owners)
  GroupedExpertsSaved experts;
  Tensor sg, su, sact;  // shared expert: gate, up, activation
  Tensor shared_out;    // f32 [T,H] the shared expert's output (added in combine)
};

// What the backward steps hand each other.
struct MoeMlpBackward {
  CombineGrads combined;       // d rows at the experts' output, d routing weights (weight after down)
  GroupedExpertsGrads d_rows;  // d rows at the experts' input, d row weights (weight before down)
  Tensor d_x;                  // f32 [T,H]
  Tensor d_out;                // the MLP output's gradient, for the shared expert's backward
  Tensor d_shared_gate_x, d_shared_up_x;  // the shared expert's parts of d_x, added last
};

// x f32 [T,H]; token_mask bool [T] (masked tokens are routed but not dispatched). Returns the
// MLP output f32 [T,H] (rounded at the bf16 emulation points).
Tensor moe_mlp_forward(const std::string& layer_prefix, const TensorMap& w, const Tensor& x, const Tensor& token_mask,
                       const MoeMlpSpec& spec, Precision precision, MoeMlpCache& cache);

// The same as steps, the runtime's ops (forward in this order, backward in reverse); the cache
// carries what one step hands the next. route: router on x, dispatch plan. dispatch: the token
// rows in expert order. shared (only with a shared expert): the shared expert on every token (under
// expert parallelism it runs while the dispatch's all-to-all is in flight). experts: the grouped
// expert MLPs on the rows. combine: the weighted sum over K, plus the shared expert's output: the
// MLP output. moe_mlp_forward runs them all; SublayerRun (sublayer_run.hpp) runs the backward steps.
void moe_route_forward(const std::string& layer_prefix, const TensorMap& w, const Tensor& x, const Tensor& token_mask,
                       const MoeMlpSpec& spec, Precision precision, MoeMlpCache& cache);
void moe_dispatch_forward(MoeMlpCache& cache);
void moe_shared_forward(const std::string& layer_prefix, const TensorMap& w, Precision precision, MoeMlpCache& cache);
void moe_experts_forward(const std::string& layer_prefix, const TensorMap& w, const MoeMlpSpec& spec,
                         Precision precision, MoeMlpCache& cache);
// (They read no parameter: the combine op's output norm and residual add are the family's mlp_output_*.)
Tensor moe_combine_forward(const MoeMlpSpec& spec, Precision precision, MoeMlpCache& cache);
void moe_combine_backward(const Tensor& d_out, const MoeMlpSpec& spec, Precision precision, const MoeMlpCache& cache,
                          MoeMlpBackward& b);
void moe_shared_backward(const std::string& layer_prefix, const TensorMap& w, Precision precision,
                         const MoeMlpCache& cache, MoeMlpBackward& b, const TensorMap& grads);
void moe_experts_backward(const std::string& layer_prefix, const TensorMap& w, const MoeMlpSpec& spec,
                          Precision precision, const MoeMlpCache& cache, MoeMlpBackward& b, const TensorMap& grads);
void moe_dispatch_backward(const MoeMlpSpec& spec, Precision precision, const MoeMlpCache& cache, MoeMlpBackward& b);
// Returns d_x.
Tensor moe_route_backward(const std::string& layer_prefix, const TensorMap& w, const MoeMlpSpec& spec,
                          const MoeMlpCache& cache, MoeMlpBackward& b, const TensorMap& grads);

// Expert parallelism, an owner's side of a layer's experts (the expert-group unit's parameters in
// w: this rank's experts only): forward on every source's rows (source order), outputs
// concatenated in that order; backward on their gradients, each source's weight gradients added to
// grads[source], input gradients concatenated.
struct ExpertGroupCache {
  std::vector<GroupedExpertsSaved> sources;
};
Tensor moe_expert_group_forward(const std::string& layer_prefix, const TensorMap& w, const MoeMlpSpec& spec,
                                Precision precision, std::vector<ExpertSourceRows> sources, ExpertGroupCache& cache);
ExpertRowGrads moe_expert_group_backward(const std::string& layer_prefix, const TensorMap& w, const MoeMlpSpec& spec,
                                         Precision precision, const ExpertGroupCache& cache, const Tensor& d_rows,
                                         const std::vector<TensorMap>& grads);

}  // namespace atl
