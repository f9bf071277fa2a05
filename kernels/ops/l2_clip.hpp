// L2 clip per head vector on f32 CPU tensors (MODELS.md §1.4.3, §10.2.5; math in
// kernels/cpu/l2_clip.hpp): u = scale ⊙ x, y = u · min(1, ρ / max(‖u‖₂, tiny)) over the last dim,
// in fp32; in precision bf16 the output is rounded once. The scale (optional) is per channel and
// shared by every head.
#pragma once
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct L2ClipForward {
  Tensor y;      // like x
  Tensor norms;  // f32 [rows]: ‖scale ⊙ x‖₂ of each head vector, saved for backward
};

// x [..., d]; scale [d] or undefined; radius > 0.
L2ClipForward l2_clip_forward(const Tensor& x, const Tensor& scale, float radius, Precision precision);
// Returns dx; accumulates d loss / d scale into *dscale (f32 [d]) when scale is defined and dscale not null.
Tensor l2_clip_backward(const Tensor& dy, const Tensor& x, const Tensor& scale, float radius, const Tensor& norms,
                        const Tensor* dscale);

}  // namespace atl
