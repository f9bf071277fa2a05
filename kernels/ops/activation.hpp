// Gated activations (SwiGLU, SiTU-GLU) on f32 CPU tensors, forward and backward (MODELS.md §0.6,
// §10.1.10). Computed in fp32; in precision bf16 the output is rounded once to bf16. Gradients stay
// fp32 (the output rounding is straight-through).
#pragma once
#include "kernels/cpu/activation.hpp"
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// Packed form: gate_up [..., 2I] in cfg.layout -> out [..., I].
Tensor glu_forward(const Tensor& gate_up, const GluConfig& cfg, Precision precision);
// d_out [..., I], the forward input gate_up [..., 2I] -> d_gate_up [..., 2I].
Tensor glu_backward(const Tensor& d_out, const Tensor& gate_up, const GluConfig& cfg);

// Two-tensor form (dense MLP): gate, up [..., I] -> out [..., I]; cfg.layout is ignored.
Tensor glu_forward(const Tensor& gate, const Tensor& up, const GluConfig& cfg, Precision precision);
struct GluSplitGrads {
  Tensor d_gate;
  Tensor d_up;
};
GluSplitGrads glu_backward(const Tensor& d_out, const Tensor& gate, const Tensor& up, const GluConfig& cfg);

// silu(g) * u, the dense-MLP SwiGLU.
Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Precision precision);
GluSplitGrads swiglu_backward(const Tensor& d_out, const Tensor& gate, const Tensor& up);

}  // namespace atl
