// Relative-logit bias for kernels/cpu/attention.hpp (MODELS.md §1.4.5, §10.2.4): per query
// profiles P [B, Hq, S, R]; bias(t, j) = P[b, h, t, t - j] when 0 <= t - j < R, else 0. Added after
// the D^-0.5 scaling. Inside a document t - j is the document distance pos[t] - pos[j]; keys of
// other documents are masked anyway.
#pragma once
#include <cstdint>

#include "kernels/cpu/attention.hpp"

namespace atl::cpu {

template <class T>
struct RelativeProfileBias {
  const T* profiles = nullptr;  // [B, Hq, S, R]
  T* grads = nullptr;           // same layout, accumulated; may be null
  std::int64_t heads = 0, seq = 0, extent = 0;

  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t distance) const {
    return ((b * heads + h) * seq + t) * extent + distance;
  }
  T value(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t j) const {
    const std::int64_t distance = t - j;
    return distance >= 0 && distance < extent ? profiles[index(b, h, t, distance)] : T(0);
  }
  void add_grad(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t j, T g) const {
    const std::int64_t distance = t - j;
    if (grads != nullptr && distance >= 0 && distance < extent) grads[index(b, h, t, distance)] += g;
  }
};

// Query-conditioned sink logits sigma [B, Hq, S] (grads same layout, accumulated; may be null).
template <class T>
SinkLogits<T> query_sink_logits(const T* values, T* grads, std::int64_t heads, std::int64_t seq) {
  SinkLogits<T> s;
  s.values = values;
  s.grads = grads;
  s.batch_stride = heads * seq;
  s.head_stride = seq;
  s.query_stride = 1;
  return s;
}

}  // namespace atl::cpu
