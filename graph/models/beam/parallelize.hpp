// Beam's parallelization rules in one place (TorchTitan's per-model parallelize; MODELS.md §3.5,
// §5.3, §5.6): the fp32 islands and unit formation, and the tensors that cross a pipeline cut.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/models/beam/config.hpp"
#include "graph/plan/plan.hpp"
#include "graph/tensor_meta.hpp"

namespace atl {

// The router (mlp.gate: weight + e_score_correction_bias) is the only island; blocks cast their
// hidden states themselves so the fp32 RoPE tables pass unchanged.
FamilyShardingRules beam_sharding_rules();

// A cut before any layer: one hidden tensor [rows, seq, H] in the compute dtype (RoPE tables are
// recomputed per stage, not sent).
std::vector<TensorMeta> beam_pipeline_boundary(const BeamConfig& config, std::int64_t rows, std::int64_t seq,
                                               Precision precision);

}  // namespace atl
