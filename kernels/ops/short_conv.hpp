// Short causal convolutions with a residual on f32 CPU tensors (MODELS.md §1.4.2, §10.2.3; math
// in kernels/cpu/short_conv.hpp): y = xm + Σ_{j<W} tap_j · lag_j(xm), xm = x zeroed at invalid
// tokens, lags never crossing a document start (pos[t] < j reads 0) or the start of the row.
// Accumulation in fp32; in precision bf16 the output is rounded once.
#pragma once
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

// Static taps. x [B, S, C] or [B*S, C] (any shape whose last dim is C and whose tokens match
// positions i64 [B, S] / valid bool [B, S]); weight [G, W] with C % G == 0: channel c uses row
// c / (C/G). Returns y shaped like x.
Tensor short_conv_forward(const Tensor& x, const Tensor& weight, const Tensor& positions, const Tensor& valid,
                          Precision precision);
// Returns dx; accumulates d loss / d weight into *dweight (f32 [G, W]) when not null.
Tensor short_conv_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& positions,
                           const Tensor& valid, const Tensor* dweight);

// Dynamic (per token and head) taps: x [..., Hh, Dh] with B*S tokens, taps [..., Hh, W] with the
// same tokens: y[t,h,:] = xm[t,h,:] + Σ_j taps[t,h,j] · lag_j(xm)[t,h,:].
Tensor dynamic_short_conv_forward(const Tensor& x, const Tensor& taps, const Tensor& positions, const Tensor& valid,
                                  Precision precision);

struct DynamicShortConvGrads {
  Tensor dx;     // like x
  Tensor dtaps;  // like taps
};
DynamicShortConvGrads dynamic_short_conv_backward(const Tensor& dy, const Tensor& x, const Tensor& taps,
                                                  const Tensor& positions, const Tensor& valid);

}  // namespace atl
