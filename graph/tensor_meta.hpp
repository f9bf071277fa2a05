// A tensor's static description (no data): what crosses a pipeline boundary, an edge of the plan.
#pragma once
#include <string>
#include <vector>

#include "kernels/dtype.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct TensorMeta {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  // shape[0] is a bound, not the size: rows dispatched to experts depend on the data (masked tokens
  // are not dispatched).
  bool upper_bound = false;
  std::string describe() const {
    return name + " " + std::string(dtype_name(dtype)) + (upper_bound ? "<=" : "") + shape_string(shape);
  }
  std::int64_t bytes() const;  // at most, with upper_bound
  bool operator==(const TensorMeta&) const = default;
};

// Empty when `tensors` fit `metas` one by one (dtype, shape; with upper_bound the first dim at
// most), else what differs first.
std::string meta_mismatch(const std::vector<Tensor>& tensors, const std::vector<TensorMeta>& metas);

}  // namespace atl
