// A tensor's static description (no data): what crosses a pipeline boundary, an edge of the plan.
#pragma once
#include <string>

#include "kernels/dtype.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct TensorMeta {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  std::string describe() const { return name + " " + std::string(dtype_name(dtype)) + shape_string(shape); }
  bool operator==(const TensorMeta&) const = default;
};

}  // namespace atl
