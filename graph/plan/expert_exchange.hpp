// Which dispatched rows travel where under expert parallelism (MODELS.md §5.5, the all_to_all
// flow). Every rank of an ep group dispatches its tokens' (token, slot) rows in expert order; EP
// rank e owns experts [e n, (e+1) n) with n = E / ep, so the rows for owner e are one contiguous
// run of the source's rows, and an owner receives, per source in ep index order, its local
// experts' rows in expert order. The rows per expert of every source (an all-gather over the ep
// group) fix all of it; every rank derives the same numbers.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/tensor.hpp"

namespace atl {

struct ExpertExchange {
  std::vector<std::int64_t> send_rows;  // [ep] rows this rank sends to each owner
  std::vector<std::int64_t> recv_rows;  // [ep] rows it receives from each source
  // [ep][n + 1]: each source's rows per local expert, as offsets from that source's first row
  std::vector<std::vector<std::int64_t>> source_offsets;
  std::int64_t received() const;  // rows received in all
  std::int64_t sent() const;      // rows sent in all
};

// all_counts i64 [ep * E]: source j's rows per expert at [j E, (j+1) E); `ep_index`: this rank's.
// Throws std::invalid_argument when ep does not divide E or a count is negative.
ExpertExchange plan_expert_exchange(const Tensor& all_counts, int ep, int ep_index);

// counts scaled by `width` (elements per row), for an all_to_all_v of rows `width` wide.
std::vector<std::int64_t> element_counts(const std::vector<std::int64_t>& rows, std::int64_t width);

}  // namespace atl
