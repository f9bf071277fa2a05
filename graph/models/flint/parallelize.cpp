#include "graph/models/flint/parallelize.hpp"

namespace atl {

FamilyShardingRules flint_sharding_rules() {
  FamilyShardingRules rules;
  rules.family = "flint";
  rules.fp32_modules = {"_fp32_params", "lm_head"};  // _keep_in_fp32_modules_strict (MODELS.md §2.3)
  rules.head_is_island = true;
  return rules;
}

std::vector<TensorMeta> flint_pipeline_boundary(const FlintConfig& config, std::int64_t rows, std::int64_t seq,
                                                Precision precision) {
  return {{"hidden", {rows, seq, config.hidden_size}, compute_dtype(precision)}};
}

}  // namespace atl
