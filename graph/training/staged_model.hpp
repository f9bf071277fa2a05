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
