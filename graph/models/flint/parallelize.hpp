// Flint's parallelization rules in one place (MODELS.md §2.3, §5.3, §5.6): the fp32 islands
// (_keep_in_fp32_modules_strict: the attention sinks' holder and lm_head) and the tensors that
// cross a pipeline cut.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/models/flint/config.hpp"
#include "graph/plan/plan.hpp"
#include "graph/tensor_meta.hpp"

namespace atl {

FamilyShardingRules flint_sharding_rules();

// A cut before any layer: one hidden tensor [rows, seq, H] in the compute dtype.
std::vector<TensorMeta> flint_pipeline_boundary(const FlintConfig& config, std::int64_t rows, std::int64_t seq,
                                                Precision precision);

}  // namespace atl
