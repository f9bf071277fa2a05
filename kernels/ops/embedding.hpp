// Token embedding lookup. A bf16 table is read exactly (bf16 -> f32 is exact).
#pragma once
#include "kernels/tensor.hpp"

namespace atl {

// table[V, H], ids i64[...] -> [..., H]; an id outside [0, V) is an error naming it.
Tensor embedding_forward(const Tensor& table, const Tensor& ids);
// dtable[V, H] += scatter of dy[..., H] by ids.
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable);

}  // namespace atl
