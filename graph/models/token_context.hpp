// Per micro-batch inputs every block of a model reads.
#pragma once
#include <cstdint>

#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

struct TokenContext {
  Tensor positions;  // i64 [B, S]
  Tensor valid;      // bool [B, S]
  std::int64_t rows = 0, seq = 0;
  Precision precision = Precision::fp32;
  std::int64_t tokens() const { return rows * seq; }
};

}  // namespace atl
