// The dense SwiGLU MLP of Beam and Flint: down(silu(gate(x)) * up(x)), every projection a bulk
// projection (rounded at the bf16 emulation points). Parameters under `<layer prefix>mlp.`:
// gate_proj.weight, up_proj.weight [I, H], down_proj.weight [H, I].
#pragma once
#include <string>

#include "graph/param.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct DenseMlpCache {
  Tensor g, u, act;  // gate, up, activation
};

Tensor dense_mlp_forward(const std::string& layer_prefix, const TensorMap& w, const Tensor& x, Precision precision,
                         DenseMlpCache& cache);
// Returns d_x; accumulates the three weights' gradients into `grads`.
Tensor dense_mlp_backward(const std::string& layer_prefix, const TensorMap& w, const Tensor& x, const Tensor& d_out,
                          Precision precision, const DenseMlpCache& cache, const TensorMap& grads);

}  // namespace atl
