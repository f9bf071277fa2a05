#include "graph/models/beam/parallelize.hpp"

namespace atl {

FamilyShardingRules beam_sharding_rules() {
  FamilyShardingRules rules;
  rules.family = "beam";
  rules.fp32_modules = {"mlp.gate"};
  rules.block_casts_inputs_itself = true;
  rules.cp_chunks_per_rank = 2;  // load-balanced (MODELS.md §5.7)
  return rules;
}

std::vector<TensorMeta> beam_pipeline_boundary(const BeamConfig& config, std::int64_t rows, std::int64_t seq,
                                               Precision precision) {
  return {{"hidden", {rows, seq, config.hidden_size}, compute_dtype(precision)}};
}

}  // namespace atl
