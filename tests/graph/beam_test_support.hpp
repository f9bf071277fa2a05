// Shared fixtures for Beam tests: a deterministic packed batch and fp32 model weights.
#pragma once
#include <memory>

#include "graph/data/data_source.hpp"
#include "graph/models/beam/model.hpp"

namespace atl::testing {

inline Batch synthetic_batch(std::int64_t rows, std::int64_t seq, std::uint64_t seed, std::int64_t vocab = 250) {
  DataConfig dc;
  dc.synthetic_min_doc = 5;
  dc.synthetic_max_doc = 20;  // several documents per row: masks and positions matter
  return make_data_source(dc, vocab, seed)->next(rows, seq);
}

}  // namespace atl::testing
