// MoE router on fp32 logits [T,E] (the caller does the fp32 matmul), forward and backward
// (MODELS.md §0.5, §10.1.7, §10.1.9). Everything is fp32; in precision bf16 only the final
// routing weights are rounded to bf16 (unless router_weights_fp32).
#pragma once
#include "kernels/cpu/router.hpp"
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct RouterForward {
  Tensor indices;  // i32 [T,K], by selection score descending, ties to the lower expert id
  Tensor weights;  // f32 [T,K], routing weights (bf16 values in precision bf16)
  Tensor scores;   // f32 [T,E] saved for backward: sigmoid / softmax over E / raw logits (see cpu::router_scores)
};

// correction_bias: f32 [E] added to the scores for selection only; may be undefined (no bias).
RouterForward router_forward(const Tensor& logits, const Tensor& correction_bias, const RouterConfig& cfg,
                             Precision precision);

// d_weights f32 [T,K] -> d_logits f32 [T,E]. The bias gets no gradient (it only selects).
Tensor router_backward(const Tensor& d_weights, const RouterForward& saved, const RouterConfig& cfg);

}  // namespace atl
