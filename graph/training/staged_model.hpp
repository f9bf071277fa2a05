// A model as the actor runtime executes it: a chain of ops, each described by an OpSpec — its
// name, the named activations it reads and writes, and the parameters it reads (so the plan knows
// which FSDP units each op needs). A MicroBatchRun carries one micro-batch's activations between
// ops, so a stage can run op i as soon as op i's units are gathered.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/param.hpp"
#include "graph/plan/op_graph.hpp"
#include "graph/plan/plan.hpp"
#include "graph/tensor_meta.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct LossSum {
  double loss_sum = 0;       // sum of token cross entropies (nats)
  std::int64_t targets = 0;  // tokens that have a target
};

// Router decisions of one sparse layer for one micro-batch (parity checks, instrumentation).
struct RoutingRecord {
  std::int64_t layer = 0;
  Tensor indices;  // i32 [T, K]
};

// Expert parallelism (MODELS.md §5.5): the experts op of an MoE layer runs as an exchange. The
// source rank hands out its dispatched rows, the owners run their experts on every source's rows,
// and the source takes the results back (forward: expert outputs; backward: row gradients).
struct ExpertRowsOut {
  Tensor x_rows, w_rows;                  // f32 [P, H], [P]: the dispatched rows, expert order
  std::vector<std::int64_t> expert_rows;  // [E] rows per expert
  // What the all_gather flow moves instead: the MLP input f32 [T, H], the routing (indices i32
  // [T, K], weights f32 [T, K]), the token mask bool [T]; and the (token, slot) pair of each row.
  Tensor tokens, indices, weights, token_mask;
  Tensor row_pair;  // i64 [P]
};
struct ExpertSourceRows {  // one source's rows for this rank's experts
  Tensor x_rows, w_rows;                  // f32 [R, H], [R]
  std::vector<std::int64_t> offsets;      // [n + 1] rows per local expert, as offsets
};
struct ExpertRowGrads {
  Tensor d_x_rows, d_w_rows;  // f32 [R, H], [R]
};

class MicroBatchRun {
 public:
  virtual ~MicroBatchRun() = default;
  // Ops run forward in order 0..n-1, then backward in order n-1..0.
  virtual void forward(int op, const TensorMap& weights) = 0;
  // Accumulates the gradient of grad_scale * loss_sum into grads (for op's parameters only).
  virtual void backward(int op, const TensorMap& weights, const TensorMap& grads) = 0;
  virtual double loss_sum() const = 0;
  // Router choices of every sparse layer run forward so far, in layer order.
  virtual std::vector<RoutingRecord> routing() const { return {}; }
  virtual std::int64_t targets() const = 0;

  // Expert parallelism, the experts op `op` (a model without it throws std::logic_error). As the
  // source, after the dispatch forward: the rows to send (moved out); after the exchange: the
  // expert outputs f32 [P, H] in dispatch order (the combine reads them). Backward, after the
  // combine backward: the gradient at the expert outputs f32 [P, H] (moved out); after the
  // exchange: the gradients at the expert inputs (the dispatch backward reads them).
  virtual ExpertRowsOut expert_rows(int op);
  virtual void set_expert_output(int op, Tensor down_out);
  virtual Tensor expert_output_grad(int op);
  virtual void set_expert_input_grads(int op, ExpertRowGrads grads);
  // As an owner of experts [first, first + n) (w: their parameters, the expert-group unit's):
  // forward on every source's rows, source order; returns the outputs f32 [sum R, H] in the same
  // order, keeping what backward needs. Backward: d_rows f32 [sum R, H] in that order; each
  // source's weight gradients are added to grads[source] (one partial per source, so the expert
  // weight gradient keeps the reference's order of micro-batches); returns the input gradients.
  virtual Tensor expert_group_forward(int op, const TensorMap& w, std::vector<ExpertSourceRows> sources);
  virtual ExpertRowGrads expert_group_backward(int op, const TensorMap& w, const Tensor& d_rows,
                                               const std::vector<TensorMap>& grads);
};

class StagedModel {
 public:
  virtual ~StagedModel() = default;
  // Ops in forward order (backward runs them in reverse).
  virtual const std::vector<OpSpec>& ops() const = 0;
  int op_count() const { return static_cast<int>(ops().size()); }
  OpKind op_kind(int op) const { return ops()[static_cast<std::size_t>(op)].kind; }
  std::int64_t op_layer(int op) const { return ops()[static_cast<std::size_t>(op)].layer; }
  virtual std::unique_ptr<MicroBatchRun> start(const Batch& micro_batch, Precision precision,
                                               float grad_scale) const = 0;
  // Every activation the ops read or write (OpSpec inputs and outputs), as the tensors a
  // micro-batch of rows x seq tokens holds (sublayer_activation_metas); the run checks each op's
  // outputs against them.
  virtual std::map<std::string, std::vector<TensorMeta>> activation_metas(std::int64_t rows,
                                                                          std::int64_t seq) const = 0;
  // Routed experts of each MoE layer (E; the router load statistics count tokens per expert).
  virtual std::int64_t routed_experts() const = 0;
};

// How a family's layer splits into ops. Layer parameters (names below the layer) under "mlp." and
// the MLP's norms belong to the MLP side, the rest to attention.
struct SublayerSplit {
  std::vector<std::string> mlp_input_norm;   // e.g. "pre_feedforward_layernorm.weight"
  std::vector<std::string> mlp_output_norm;  // e.g. "post_feedforward_layernorm.weight" (none: plain residual)
  std::function<bool(std::int64_t)> sparse;  // layers whose MLP is an MoE
  std::function<bool(std::int64_t)> shared_expert;  // MoE layers with a shared expert (empty: none)
  // Non-empty: the depth mixes are ops of their own (Inkling2's AttnRes): "<layer>.attention_mix"
  // reads the layer parameters with these name prefixes (state.l -> attn_in.l, which attention
  // reads too), and "<layer>.mlp_mix" the mlp_input_norm ones (mid -> x.l, the router's input).
  std::vector<std::string> attention_mix_prefixes;
};

// The ops of a model: "embed" (the rules' embedding modules: input_ids -> <state>.0), per decoder
// layer its sublayer ops (parameters under "<layer_prefix><l>"), "head" (every other parameter:
// root, head, model-level islands; <state>.L -> logits), "loss" (logits, targets -> loss). A
// layer: "<layer>.attention" (<state>.l -> <state>_mid.l), then for a dense layer "<layer>.mlp"
// (-> <state>.l+1), for an MoE layer "<layer>.router" (input norm, mlp.gate: -> x.l, routing.l),
// "<layer>.dispatch" (-> rows.l), with a shared expert "<layer>.shared_expert"
// (mlp.shared_experts: x.l -> shared_out.l), "<layer>.experts" (mlp.experts: -> expert_out.l),
// "<layer>.combine" (the output norm: -> <state>.l+1).
std::vector<OpSpec> sublayer_ops(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules,
                                 std::int64_t layers, const std::string& state, const SublayerSplit& split);

// What the activations of sublayer_ops are made of, per family.
struct ActivationShapes {
  std::int64_t hidden = 0, vocab = 0;
  std::function<std::int64_t(std::int64_t)> attention_inputs;  // with mix ops: the mixes attention reads
  std::function<std::int64_t(std::int64_t)> top_k;  // experts per token of a sparse layer
  // The family's state tensors (T tokens) before layer l (l = layers: the head's input) or after
  // its attention sublayer (mid).
  std::function<std::vector<TensorMeta>(std::int64_t layer, bool mid, std::int64_t tokens)> state;
};

// Every activation of sublayer_ops(..., layers, state, split) for a micro-batch of rows x seq
// tokens (T = rows * seq), as the tensors the runtime holds: input_ids, targets i64 [rows, seq];
// the states; x.l f32 [T, H]; routing.l i32 [T, K] indices and f32 [T, K] weights; rows.l the
// dispatched rows f32 [<= T*K, H] and their weights f32 [<= T*K]; expert_out.l f32 [<= T*K, H];
// logits f32 [T, V]; loss none (two numbers, reported out of band).
std::map<std::string, std::vector<TensorMeta>> sublayer_activation_metas(const ActivationShapes& shapes,
                                                                         std::int64_t layers, const std::string& state,
                                                                         const SublayerSplit& split, std::int64_t rows,
                                                                         std::int64_t seq);

}  // namespace atl
