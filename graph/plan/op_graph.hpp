// The op graph of a model (DESIGN.md "The plan is the dataflow graph"): ops in forward order, each
// with the named activations it reads and writes and the parameters it reads, from which the
// plan derives the FSDP units each op needs.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/plan/plan.hpp"
#include "graph/tensor_meta.hpp"

namespace atl {

enum class OpKind {
  embedding,  // token ids -> hidden state
  attention_mix,  // Inkling2: the depth mixes and norms attention reads (state -> attn_in)
  attention,  // a layer's attention sublayer, residual included
  mlp_mix,    // Inkling2: the MLP's depth mix and norm (mid state -> x)
  mlp,        // a layer's dense MLP sublayer, norms and residual included
  router,     // an MoE sublayer's input norm and router: the routing and the dispatch plan
  dispatch,   // token rows in expert order (where expert parallelism's all-to-all goes)
  shared_expert,  // an MoE's shared expert on every token (overlaps the dispatch under EP)
  experts,    // the grouped expert MLPs on their rows (on the experts' owner under EP)
  combine,    // weighted sum over K back on the tokens, + the shared expert's output, output norm, residual
  head,       // the final mix/norm and lm_head: the state -> logits
  loss,       // softcap, vocabulary mask, cross entropy: logits, targets -> loss
};
const char* op_kind_name(OpKind kind);

struct OpSpec {
  std::string name;  // "embed", "layers.3.attention", "head"
  OpKind kind = OpKind::embedding;
  std::int64_t layer = -1;           // decoder layer, -1 if none
  std::vector<std::string> inputs;   // named activations read (forward)
  std::vector<std::string> outputs;  // named activations written (forward)
  std::vector<std::string> params;   // full names of the parameters it reads
};

// For each op, the plan's units that own a parameter it reads (plan order). A unit may be read
// by several ops (a block by its layer's attention and MLP ops). Throws std::logic_error when a
// unit is read by no op (it would never be gathered or reduce, and a step would wait on it
// forever) or an op names a parameter no unit owns.
std::vector<std::vector<std::size_t>> units_per_op(const Plan& plan, const std::vector<OpSpec>& ops);

// One line per activation, in the order the ops first name them: its tensors (dtype, shape; "<="
// for a bound) and bytes. `metas`: the model's activation_metas for one micro-batch.
std::string format_activations(const std::vector<OpSpec>& ops,
                               const std::map<std::string, std::vector<TensorMeta>>& metas);

}  // namespace atl
