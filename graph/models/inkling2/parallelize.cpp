#include "graph/models/inkling2/parallelize.hpp"

namespace atl {

FamilyShardingRules inkling2_sharding_rules() {
  FamilyShardingRules rules;
  rules.family = "inkling2";
  rules.fp32_modules = {"attn_query", "mlp_query", "output_query", "q_l2_clip", "rel_l2_clip", "mlp.gate"};
  rules.layer_prefix = "layers.";
  rules.embedding_modules = {"embed_tokens", "embed_norm"};
  rules.head_modules = {"lm_head"};
  rules.block_casts_inputs_itself = true;  // Inkling2Parallelizer keeps model-owned casts
  return rules;
}

std::vector<TensorMeta> inkling2_pipeline_boundary(const Inkling2Config& config, std::int64_t cut, std::int64_t rows,
                                                   std::int64_t seq, Precision precision) {
  const std::int64_t sources = config.completed_blocks_before(cut) + 1;
  return {{"history", {rows, seq, sources, config.hidden_size}, compute_dtype(precision)},
          {"layout", {rows, seq, 2}, DType::i64}};
}

}  // namespace atl
