// Positional ops on per-head q/k (f32 CPU tensors): NeoX rotate-half RoPE and SSMax query scaling.
// x is [T, heads, D] or [B, S, heads, D]; positions i64 hold one document position per token
// ([T] or [B, S]). Callers round the result to bf16 in precision bf16 (MODELS.md §10.1.11-12).
#pragma once
#include "kernels/tensor.hpp"

namespace atl {

// y[..., i] = x[i] cos - x[i+D/2] sin, y[..., i+D/2] = x[i+D/2] cos + x[i] sin, with
// angle = pos * theta^(-2i/D) and cos/sin computed in fp32. D must be even.
Tensor rope_forward(const Tensor& x, const Tensor& positions, float theta);
// The transposed rotation (dx from dy).
Tensor rope_backward(const Tensor& dy, const Tensor& positions, float theta);

// q * (1 + (pos+1)/base)^exponent per token, factor in fp32 (Beam full layers: base 2048, exponent 0.1).
Tensor ssmax_forward(const Tensor& q, const Tensor& positions, float base, float exponent);
Tensor ssmax_backward(const Tensor& dy, const Tensor& positions, float base, float exponent);

}  // namespace atl
