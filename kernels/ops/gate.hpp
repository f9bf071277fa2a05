// Beam attention output gate (f32 CPU tensors): y = o * sigmoid(gate + bias[head]), sigmoid in fp32.
// o and gate share a shape whose last dim is Hq*D (channel h*D + d belongs to head h), e.g. [T, Hq*D]
// or [B, S, Hq*D]; bias is [Hq].
#pragma once
#include "kernels/tensor.hpp"

namespace atl {

Tensor output_gate_forward(const Tensor& o, const Tensor& gate, const Tensor& bias);

struct OutputGateGrads {
  Tensor d_o, d_gate;
};

// Returns d_o and d_gate; adds d loss / d bias into *d_bias (f32 [Hq]) when not null.
OutputGateGrads output_gate_backward(const Tensor& dy, const Tensor& o, const Tensor& gate, const Tensor& bias,
                                     Tensor* d_bias);

}  // namespace atl
