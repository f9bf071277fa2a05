// Grouped MoE experts inside one process on f32 CPU tensors: dispatch, expert MLPs, combine,
// forward and backward (MODELS.md §0.5, §10.1.8, §10.1.12; math in kernels/cpu/experts.hpp).
#pragma once
#include "kernels/cpu/experts.hpp"
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// What backward needs besides the parameters (which the caller passes again, e.g. re-gathered).
struct ExpertsSaved {
  Tensor x;               // f32 [T,H] (shares the caller's storage)
  Tensor indices;         // i32 [T,K]
  Tensor weights;         // f32 [T,K]
  Tensor row_pair;        // i64 [P] pair t*K+j of each dispatched row, grouped by expert
  Tensor expert_offsets;  // i64 [E+1]
  Tensor pair_row;        // i64 [T*K] row of each pair, -1 when its token is masked out
  Tensor gate_up_out;     // f32 [P,2I] activation input
  Tensor act_out;         // f32 [P,I] unweighted activation
  Tensor down_out;        // f32 [P,H] down output (before the weight when weight_after_down)
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
