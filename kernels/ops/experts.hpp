// Grouped MoE experts on f32 CPU tensors (MODELS.md §0.5, §10.1.8, §10.1.12; math in
// kernels/cpu/experts.hpp), as three ops with forward and backward — dispatch (rows in expert
// order), grouped experts (local experts on their rows), combine (weighted sum over K) — the
// points where expert parallelism puts its all-to-alls; and experts_forward / experts_backward,
// the three in one process.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/experts.hpp"
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// Which rows each expert gets (a "pair" is p = t*K + j, a "row" a dispatched pair's place in
// expert order), and the routing it came from.
struct ExpertDispatch {
  Tensor indices;         // i32 [T,K]
  Tensor weights;         // f32 [T,K]
  Tensor row_pair;        // i64 [P] pair t*K+j of each dispatched row, grouped by expert
  Tensor expert_offsets;  // i64 [E+1] rows of expert e: [offsets[e], offsets[e+1])
  Tensor pair_row;        // i64 [T*K] row of each pair, -1 when its token is masked out
  std::int64_t experts() const { return expert_offsets.numel() - 1; }
  std::int64_t rows() const { return row_pair.numel(); }
};

// Dispatch forward. indices i32 [T,K] (experts in [0, experts)), weights f32 [T,K], token_mask
// bool [T] (undefined: every token). x f32 [T,H] -> x_rows f32 [P,H], w_rows f32 [P].
ExpertDispatch plan_expert_dispatch(const Tensor& indices, const Tensor& weights, const Tensor& token_mask,
                                    std::int64_t experts);
struct DispatchedRows {
  Tensor x_rows, w_rows;
};
DispatchedRows dispatch_forward(const Tensor& x, const ExpertDispatch& dispatch);
// Dispatch backward: dx f32 [T,H] sums each token's rows (ascending expert id); d_weights [T,K]
// takes d_w_rows where the routing weight comes before down (else it is left as is).
void dispatch_backward(const Tensor& d_x_rows, const Tensor& d_w_rows, const ExpertDispatch& dispatch,
                       const ExpertsConfig& cfg, const Tensor& dx, const Tensor& d_weights);

// Grouped experts over local experts [first, first + n) of the routing: gate_up f32 [n,H,2I],
// down f32 [n,I,H]; rows [offsets[first], offsets[first+n]) of the dispatch, given as x_rows
// [R,H], w_rows [R] with R that many rows.
struct GroupedExpertsSaved {
  Tensor x_rows, w_rows;   // f32 [R,H], [R]
  Tensor offsets;          // i64 [n+1]: the local experts' row ranges (relative to the first row)
  Tensor gate_up_out;      // f32 [R,2I] activation input
  Tensor act_out;          // f32 [R,I] unweighted activation
  Tensor down_out;         // f32 [R,H] down output (weighted when the weight comes first)
};
GroupedExpertsSaved grouped_experts_forward(const Tensor& x_rows, const Tensor& w_rows, const ExpertDispatch& dispatch,
                                            std::int64_t first_expert, const Tensor& gate_up, const Tensor& down,
                                            const ExpertsConfig& cfg);
// The same on rows given with their local experts' row offsets i64 [n+1] (non-decreasing; the
// rows are [offsets[0], offsets[n]) relative to the first): an expert group's rows from one
// source rank under expert parallelism.
GroupedExpertsSaved grouped_experts_forward(const Tensor& x_rows, const Tensor& w_rows,
                                            const std::vector<std::int64_t>& offsets, const Tensor& gate_up,
                                            const Tensor& down, const ExpertsConfig& cfg);
struct GroupedExpertsGrads {
  Tensor d_x_rows;  // f32 [R,H]
  Tensor d_w_rows;  // f32 [R] (0 when the weight comes after down)
};
// d_rows f32 [R,H]; d_gate_up, d_down accumulated (+=).
GroupedExpertsGrads grouped_experts_backward(const Tensor& d_rows, const GroupedExpertsSaved& saved,
                                             const Tensor& gate_up, const Tensor& down, const ExpertsConfig& cfg,
                                             const Tensor& d_gate_up, const Tensor& d_down);

// Rows of a dispatch and (token, slot) pairs, for an exchange that moves pairs (expert
// parallelism's all_gather flow): rows [first, first + R) of the dispatch, f32 [R, W] or [R], to
// their pairs' places in `slots` f32 [T*K, W] or [T*K] (other places untouched); and back.
void scatter_rows_to_slots(const Tensor& rows, const ExpertDispatch& dispatch, std::int64_t first_row,
                           const Tensor& slots);
Tensor gather_rows_from_slots(const Tensor& slots, const ExpertDispatch& dispatch, std::int64_t first_row,
                              std::int64_t count);

// Combine forward: out f32 [T,H] from down_out f32 [P,H] (every row of the dispatch, in order).
Tensor combine_forward(const Tensor& down_out, const ExpertDispatch& dispatch, std::int64_t hidden,
                       const ExpertsConfig& cfg);
// Combine backward: d_rows f32 [P,H]; d_weights f32 [T,K] overwritten (set where the weight comes
// after down, else 0).
struct CombineGrads {
  Tensor d_rows, d_weights;
};
CombineGrads combine_backward(const Tensor& d_out, const Tensor& down_out, const ExpertDispatch& dispatch,
                              const ExpertsConfig& cfg);

// What backward needs besides the parameters (which the caller passes again, e.g. re-gathered).
struct ExpertsSaved {
  ExpertDispatch dispatch;
  GroupedExpertsSaved experts;
};

struct ExpertsForward {
  Tensor out;  // f32 [T,H]; exactly 0 for masked tokens
  ExpertsSaved saved;
};

// x f32 [T,H], gate_up f32 [E,H,2I], down f32 [E,I,H], indices i32 [T,K], weights f32 [T,K],
// token_mask bool [T] (undefined: every token is dispatched).
ExpertsForward experts_forward(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& indices,
                               const Tensor& weights, const Tensor& token_mask, const ExpertsConfig& cfg);

struct ExpertsGrads {
  Tensor dx;         // f32 [T,H]
  Tensor d_weights;  // f32 [T,K]
};

// d_out f32 [T,H]. d_gate_up [E,H,2I] and d_down [E,I,H] are accumulated (+=).
ExpertsGrads experts_backward(const Tensor& d_out, const ExpertsSaved& saved, const Tensor& gate_up,
                              const Tensor& down, const ExpertsConfig& cfg, const Tensor& d_gate_up,
                              const Tensor& d_down);

}  // namespace atl
