// The planner: (parameter specs, family sharding rules, mesh, precision) -> Plan, the list of
// FSDP units the actor runtime executes (MODELS.md §5.2-5.3, DESIGN.md "The actors of one rank").
//
// Unit formation, per decoder layer l (params named rules.layer_prefix + l + "."):
//   1. fp32 islands: every module strictly below the block whose path matches an entry of
//      rules.fp32_modules (equal to it, or ending with "." + entry; an activation-checkpoint
//      segment "_checkpoint_wrapped_module" is ignored) becomes its own unit holding all params
//      beneath it; the outermost matching module wins (nested matches own nothing more).
//   2. the block "model.layers.<l>" with every other param of the layer.
// Model level: one unit per rules.embedding_modules entry, one per rules.head_modules entry,
// model-level fp32 islands (same matching), and the root unit "model" with the leftovers
// (model.norm). Units without params are not formed.
//
// Unit order in Plan::units is forward execution order:
//   embeddings, then per layer [islands of the layer..., block, experts (ep > 1)], then model-level islands, then
//   the root "model" (final norm), then heads.
//
// Every unit is dtype-uniform: island units hold only island params (ParamSpec::island) and take
// the island policy {f32, f32, f32, no input cast}; all other units hold no island param and take
// the bulk policy {bf16 (f32 in precision fp32), f32, bf16/f32, cast inputs} -- except blocks of a
// family whose blocks cast their own inputs (Beam: no input cast, so fp32 RoPE tables pass), and
// heads of a family with rules.head_is_island (island policy; Flint). A param that would
// break this (an island param outside any fp32-list module, or a non-island param inside one) is
// an error: it must be moved into its own submodule.
//
// Schedules (MODELS.md §5.2, DESIGN.md): blocks reshard after forward except the last layer's
// (backward needs it first), forward prefetch 1 and backward prefetch 2 along the chain of
// blocks; islands are resident for the step (gathered once, never resharded mid-step, no
// prefetch); embeddings reshard after forward; root and heads keep their params until their
// backward ends. With pp > 1 no block reshards after forward and nothing prefetches (a stage
// runs several micro-batches through its layers; re-gathering per micro-batch would cost more).
//
// Pipeline stages (MODELS.md §5.6, one stage per pp rank): the decoder layers are split as evenly
// as possible, the first (L mod pp) stages taking one more; stage 0 also holds the embeddings,
// the last stage the model-level islands, the root (final norm) and the heads.
//
// Expert parallelism (ep > 1, MODELS.md §5.1, §5.3 step 1, §5.5): each MoE layer's routed experts
// (rules.experts_module, [E, ...] on dim 0) leave the block and form one expert-group unit
// "<block>.<experts_module>" (role experts, bulk policy). EP rank r owns experts [r E/ep, (r+1) E/ep):
// the unit's params have the local shape [E/ep, ...] (ep_slices = ep; which slice a rank holds is
// its ep index), sharded on dim 1 over the ep_shard group (ep_shard = dp x cp / ep). Every param is
// owned by exactly one unit (checked).
//
// Sharding: every other param is sharded on dim 0 across the shard group (dp_shard x cp ranks). A
// param sharded on dim d of shape [s0, ..., s_d, ...] has outer = prod(shape[:d]) blocks of rows =
// s_d rows of row_numel = prod(shape[d+1:]) elements (dim 0: outer 1); 1-d params have rows =
// numel, row_numel = 1; a 0-d param is one row of one element. Each rank owns rows_per_rank =
// ceil(rows / d) rows of every outer block (the last ranks' chunks are padded with zeros, a chunk
// can be all padding). The unit's flat shard is the concatenation, in param order, of each param's
// padded chunk: param p starts at shard_offset and spans shard_numel = outer * rows_per_rank *
// row_numel elements (outer block o first).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/param.hpp"
#include "graph/plan/mesh.hpp"
#include "kernels/dtype.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct MixedPrecisionPolicy {
  DType param_dtype = DType::f32;   // dtype of the all-gather buffer and of the gathered params
  DType reduce_dtype = DType::f32;  // dtype of the gradient reduce-scatter (and HSDP all-reduce)
  DType output_dtype = DType::f32;  // floating outputs' dtype (§5.2): recorded; the models round, no cast
  bool cast_forward_inputs = false;  // cast floating forward inputs to param_dtype
  bool operator==(const MixedPrecisionPolicy&) const = default;
};

struct GatherSchedule {
  bool reshard_after_forward = true;  // free the full params after forward, re-gather for backward
  int forward_prefetch = 0;           // blocks gathered ahead during forward (depth)
  int backward_prefetch = 0;          // blocks gathered ahead during backward (depth)
  bool resident_for_step = false;     // gathered once per step, held until the step's last backward ends
  bool operator==(const GatherSchedule&) const = default;
};

enum class UnitRole { embedding, island, block, experts, head, root };
const char* unit_role_name(UnitRole role);

struct UnitParam {
  std::string name;
  Shape shape;                     // what the unit holds (an expert-group unit: its EP slice)
  int shard_dim = 0;               // the dim sharded over the unit's shard group
  std::int64_t outer = 1;          // prod(shape[:shard_dim]): blocks of rows
  std::int64_t rows = 0;           // shard_dim extent (numel for 1-d, 1 for 0-d)
  std::int64_t row_numel = 0;      // elements per row
  std::int64_t rows_per_rank = 0;  // ceil(rows / shard count)
  std::int64_t shard_offset = 0;   // start of this param's chunk inside the unit's flat shard
  std::int64_t shard_numel = 0;    // outer * rows_per_rank * row_numel (padded)

  std::int64_t numel() const { return outer * rows * row_numel; }
  // The real (unpadded) rows that shard `shard_index` owns: [first_row(i), first_row(i) + rows_on(i)).
  std::int64_t first_row(int shard_index) const;
  std::int64_t rows_on(int shard_index) const;
};

struct UnitPlan {
  std::string name;  // module path, e.g. model.layers.0.mlp.gate
  UnitRole role = UnitRole::block;
  std::int64_t layer = -1;  // decoder layer, -1 if none
  int stage = 0;            // pipeline stage that holds the unit
  std::vector<UnitParam> params;  // in spec order
  std::int64_t numel = 0;        // unpadded elements of all params
  std::int64_t shard_numel = 0;  // per rank, padded
  int shard_count = 1;           // ranks the unit is sharded over (the shard group size)
  std::string shard_axis = "dp_shard";  // its shard group: "dp_shard" (x cp), or "ep_shard" (experts)
  int ep_slices = 1;             // experts: the params are one of ep slices of the model's (dim 0)
  bool island = false;  // holds fp32 island params and takes the island policy
  DType storage_dtype = DType::f32;
  MixedPrecisionPolicy policy;
  GatherSchedule schedule;
  // The units (by name) this unit prefetches, resolved from the schedule depths: blocks prefetch
  // the next / previous blocks only (islands are resident, the others do not prefetch).
  std::vector<std::string> forward_prefetch_units;
  std::vector<std::string> backward_prefetch_units;

  const UnitParam& param(const std::string& name) const;  // throws std::out_of_range
  // HSDP: the reduce-scattered gradient is all-reduced over dp_replicate (expert groups are
  // sharded over ep_shard, which spans the replicas already).
  bool replicated(const Mesh& mesh) const { return role != UnitRole::experts && mesh.dp_replicate() > 1; }
};

struct FamilyShardingRules {
  std::string family;
  std::vector<std::string> fp32_modules;  // module names (relative) whose params form fp32 islands
  std::string layer_prefix = "model.layers.";
  std::vector<std::string> embedding_modules{"model.embed_tokens"};
  std::vector<std::string> head_modules{"lm_head"};
  bool head_is_island = false;             // head takes the island policy (Flint)
  bool block_casts_inputs_itself = false;  // block units get cast_forward_inputs = false (Beam, Inkling2)
  std::string experts_module = "mlp.experts";  // under each layer: the routed experts, [E, ...] on dim 0
  // How context parallelism splits a row (MODELS.md §5.7): 1 = contiguous, 2 = load-balanced
  // (head-tail: 2 x cp chunks, rank r holds chunks r and 2 cp - 1 - r).
  int cp_chunks_per_rank = 1;
};

// Tokens of one row that a CP rank holds: the row padded to a multiple of cp x chunks_per_rank
// (pad slots are a document of their own, §5.7), then split evenly.
std::int64_t cp_local_tokens(std::int64_t seq_len, int cp, int chunks_per_rank);

// The axis name of an expert-group unit's shard group.
inline constexpr const char* kExpertShardAxis = "ep_shard";

struct Plan {
  Mesh mesh;
  Precision precision = Precision::bf16;
  std::vector<UnitPlan> units;  // forward execution order (see the top of this file)

  const UnitPlan& unit(const std::string& name) const;              // throws std::out_of_range
  const UnitPlan& unit_of_param(const std::string& param) const;    // throws std::out_of_range
  std::size_t unit_index(const std::string& name) const;            // throws std::out_of_range
};

// Throws std::invalid_argument for a param that breaks dtype uniformity (see above), a param
// named twice, or a storage dtype mixed inside a unit; ConfigError (topology.mesh.pp) for more
// pipeline stages than decoder layers, (topology.mesh.ep) for ep > 1 when the model has no routed
// experts or ep does not divide a layer's expert count E (EP rank r owns experts [r E/ep, (r+1) E/ep)).
Plan make_plan(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules, const Mesh& mesh,
               Precision precision);

// The policies the planner assigns (exposed for the runtime and tests).
MixedPrecisionPolicy bulk_policy(Precision precision);
MixedPrecisionPolicy island_policy();

}  // namespace atl
