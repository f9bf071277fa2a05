// A model as the actor runtime executes it: a chain of ops — the embedding, one op per decoder
// layer, the final op (norm + head + loss) — each reading the parameters of the FSDP units that
// own its modules. A MicroBatchRun carries one micro-batch's activations between ops, so a stage
// can run op i as soon as op i's units are gathered.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/data/batch.hpp"
#include "graph/param.hpp"
#include "graph/plan/plan.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct LossSum {
  double loss_sum = 0;       // sum of token cross entropies (nats)
  std::int64_t targets = 0;  // tokens that have a target
};

enum class OpKind { embedding, layer, final };

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
  virtual int op_count() const = 0;
  virtual OpKind op_kind(int op) const = 0;
  virtual std::int64_t op_layer(int op) const = 0;  // the decoder layer of a layer op, else -1
  virtual std::unique_ptr<MicroBatchRun> start(const Batch& micro_batch, Precision precision,
                                               float grad_scale) const = 0;
};

// For each op of the model (embedding, each layer, final), the plan's units it reads: the
// embedding units; a layer's islands and block; the root, the head and model-level islands.
// Throws std::logic_error when a unit is read by no op or by several: a unit no op reads would
// never be gathered or reduce, and a step would wait on it forever.
std::vector<std::vector<std::size_t>> units_per_op(const Plan& plan, const StagedModel& model,
                                                   const std::string& family);

}  // namespace atl
