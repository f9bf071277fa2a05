// How the experts op moves tokens under expert parallelism (topology.ep_dispatch, MODELS.md §5.5).
// all_to_all (default; DeepEP / Megatron): counts first, then each (token, slot) row goes to the
// owner of its expert and its output comes back. all_gather (the reference algorithm): every rank
// gathers every source's tokens, routing weights, indices and mask, runs its experts on all of
// them, and an all-reduce over the ep group brings each slot's output back. Both give the same
// bits: every slot's output comes from exactly one owner, the rest of the sum is exact zeros.
#pragma once

namespace atl {

enum class ExpertDispatchFlow { all_to_all, all_gather };

inline const char* expert_dispatch_flow_name(ExpertDispatchFlow flow) {
  return flow == ExpertDispatchFlow::all_to_all ? "all_to_all" : "all_gather";
}

}  // namespace atl
