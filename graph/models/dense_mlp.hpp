// The dense SwiGLU MLP of Beam and Flint: down(silu(gate(x)) * up(x)), every projection a bulk
// projection (rounded at the bf16 emulation points). Parameters under `<layer prefix>mlp.`:
// gate_proj.weight, up_proj.weight [I, H], down_proj.weight [H, I].
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "graph/param.hpp"
#include "kernels/precision.hpp"

namespace atl {

struct DenseMlpCache {
  Tensor g, u, act;  // gate, up, activation
};

// Appends the three projections for a layer (hidden size H, width I).
void append_dense_mlp_specs(std::vector<ParamSpec>& specs, const std::string& layer_prefix, std::int64_t H,
                            std::int64_t I);

Tensor dense_mlp_forward(const std::string& layer_prefix, const TensorMap& w, const Tensor& x, Precision precision,
                         DenseMlpCache& cache);
// Returns d_x; accumulates the three weights' gradients into `grads`.
Tensor dense_mlp_backward(const std::string& layer_prefix, const TensorMap& w, const Tensor& x, const Tensor& d_out,
                          Precision precision, const DenseMlpCache& cache, const TensorMap& grads);

}  // namespace atl
