// Two tensors with the same dtype, shape and bytes: the bitwise comparison the tests mean by "the
// same bits" (float == would take -0 for +0 and fail on a NaN that is equal bit for bit).
#pragma once
#include <cstring>
#include <vector>

#include "kernels/tensor.hpp"

namespace atl::testing {

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace atl::testing
