// Flat shard buffers of one FSDP unit (layout in graph/plan/plan.hpp): what a unit actor packs
// before a collective and unpacks after it. All functions are pure and copy; f32 in and out
// except unpack_gathered, which also takes the bf16 buffer a bulk gather delivers.
//
// shard i of a unit = for each param p in order, for each outer block of p, rows [i*rpr_p,
// (i+1)*rpr_p) of its shard dim, zero-padded to rpr_p rows. A gathered buffer = shard 0 | shard 1
// | ... | shard count-1. An expert-group unit holds one EP slice of the model's expert tensors:
// pack_shard and init_shard take which (ep_index); everything else sees the slice's shape.
#pragma once
#include "graph/param.hpp"
#include "graph/plan/plan.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// The shard `shard_index` of `full_params` (every param of the unit, f32, the model's full shape;
// the unit holds EP slice ep_index of it; required for an expert-group unit): f32 [shard_numel],
// padding zero. `shard_count` must equal unit.shard_count.
Tensor pack_shard(const UnitPlan& unit, const TensorMap& full_params, int shard_index, int shard_count,
                  int ep_index = -1);
// The shard a fresh model gives rank `shard_index` (fill_initial on the rows it owns, padding 0):
// equal to pack_shard of TensorMap::initialized, without building the full model.
Tensor init_shard(const UnitPlan& unit, const std::vector<ParamSpec>& specs, std::uint64_t seed, float init_std,
                  int shard_index, int ep_index = -1);

// Full f32 params from an all-gathered buffer (f32 or bf16 [count * shard_numel], member i's shard
// at i * shard_numel); bf16 values are widened exactly; padding is dropped.
TensorMap unpack_gathered(const UnitPlan& unit, const Tensor& gathered, int count);

// The reduce-scatter input for full (unsharded) f32 grads: f32 [count * shard_numel], block i =
// what member i will own (the concatenation of pack_shard for i = 0 .. count-1).
Tensor pack_for_reduce_scatter(const UnitPlan& unit, const TensorMap& full_grads, int count);

// The model's tensors from an expert-group unit's EP slices (each in the unit's shape, slice order):
// concatenated on dim 0.
TensorMap join_ep_slices(const UnitPlan& unit, const std::vector<TensorMap>& slices);

// The real rows one shard owns, per param: its shape with shard_dim cut to rows_on(i) (a 0-d
// param reads as [1] on shard 0 and [0] elsewhere). The inverse of pack_shard, for inspection and tests.
TensorMap unpack_shard(const UnitPlan& unit, const Tensor& shard, int shard_index, int count);

}  // namespace atl
