// Inkling2's parallelization rules in one place (MODELS.md §1.6, §1.8, §5.3, §5.6): the fp32
// islands (depth queries, L2-clip scales, routers, output_query), embed_norm as an embedding unit,
// model-owned casts, and the tensors that cross a pipeline cut.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/models/inkling2/config.hpp"
#include "graph/plan/plan.hpp"
#include "graph/tensor_meta.hpp"

namespace atl {

FamilyShardingRules inkling2_sharding_rules();

// A cut before layer `cut`: the depth history [rows, seq, sources, H] in the compute dtype
// (completed blocks in order, then the partial one; sources = ceil(cut / n) + 1) and the layout
// i64 [rows, seq, 2] (positions, valid): MODELS.md §1.8.
std::vector<TensorMeta> inkling2_pipeline_boundary(const Inkling2Config& config, std::int64_t cut, std::int64_t rows,
                                                   std::int64_t seq, Precision precision);

}  // namespace atl
