// AttnRes residual mixing on f32 CPU tensors (MODELS.md §1.3, §10.2.6; math in
// kernels/cpu/residual_mix.hpp): per token, a softmax over the depth sources of <w, rms(x_s)>
// weights the unnormalised sources. fp32 throughout; in precision bf16 the output is rounded once.
#pragma once
#include <vector>

#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct ResidualMixForward {
  Tensor out;      // like the sources; with one source, the source itself (no copy, no rounding)
  Tensor weights;  // f32 [rows, N]: the mixture weights a (undefined when N == 1)
  Tensor rstd;     // f32 [rows, N] (undefined when N == 1)
};

// sources: N >= 1 tensors of one shape [..., H]; query: H elements ([H] or [1, H]; unused when N == 1).
ResidualMixForward residual_mix_forward(const std::vector<Tensor>& sources, const Tensor& query, float eps,
                                        Precision precision);

// Returns d loss / d source for each source (new tensors; with N == 1, d_out itself). Accumulates
// d loss / d query into *dquery (H elements) when not null.
std::vector<Tensor> residual_mix_backward(const Tensor& d_out, const std::vector<Tensor>& sources, const Tensor& query,
                                          const ResidualMixForward& saved, const Tensor* dquery);

}  // namespace atl
