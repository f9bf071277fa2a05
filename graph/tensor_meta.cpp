#include "graph/tensor_meta.hpp"

namespace atl {

std::int64_t TensorMeta::bytes() const {
  return shape_numel(shape) * static_cast<std::int64_t>(element_size(dtype));
}

std::string meta_mismatch(const std::vector<Tensor>& tensors, const std::vector<TensorMeta>& metas) {
  if (tensors.size() != metas.size()) {
    return std::to_string(tensors.size()) + " tensor(s) where the op graph says " + std::to_string(metas.size());
  }
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const Tensor& t = tensors[i];
    const TensorMeta& m = metas[i];
    bool fits = t.defined() && t.dtype() == m.dtype && t.shape().size() == m.shape.size();
    for (std::size_t d = 0; fits && d < m.shape.size(); ++d) {
      fits = m.upper_bound && d == 0 ? t.shape()[d] <= m.shape[d] : t.shape()[d] == m.shape[d];
    }
    if (!fits) {
      return "tensor " + std::to_string(i) + " is " + t.describe() + " where the op graph says " + m.describe();
    }
  }
  return {};
}

}  // namespace atl
