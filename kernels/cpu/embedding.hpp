#pragma once
#include <cstdint>

namespace atl::cpu {

template <class T>
void embedding_forward(const T* table, const std::int64_t* ids, T* y, std::int64_t tokens, std::int64_t dim) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const T* row = table + ids[t] * dim;
    for (std::int64_t i = 0; i < dim; ++i) y[t * dim + i] = row[i];
  }
}

// dtable[ids[t]] += dy[t], tokens in order (a fixed summation order for repeated ids).
template <class T>
void embedding_backward(const T* dy, const std::int64_t* ids, T* dtable, std::int64_t tokens, std::int64_t dim) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    T* row = dtable + ids[t] * dim;
    for (std::int64_t i = 0; i < dim; ++i) row[i] += dy[t * dim + i];
  }
}

}  // namespace atl::cpu
