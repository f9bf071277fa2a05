#pragma once
#include <cstdint>

namespace atl::cpu {

// One AdamW step (decoupled weight decay, PyTorch semantics) on n elements; step counts from 1.
// Elementwise IEEE operations only, so the vectorized loop (one per instruction set) gives the
// same bits as a scalar one. bf16_copy (optional, not overlapping the others) receives each new
// parameter rounded to bf16: precision bf16's compute weights, written while the values are in
// registers instead of in a pass over the parameters of its own.
void adamw_step(float* param, const float* grad, float* m, float* v, std::int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, std::int64_t step, float* bf16_copy = nullptr);

// Sum of x[i]^2 in double, in lane_sum's fixed order (lane_sum.hpp): a float's square is exact in
// double, so only the adds round, and the order depends on n alone: the same bits on every CPU.
// 16 independent chains vectorize; one chain in index order was 4.4% of a two-thread AMX step.
double sum_of_squares(const float* x, std::int64_t n);

}  // namespace atl::cpu
