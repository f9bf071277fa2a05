#include "graph/plan/expert_exchange.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

namespace atl {

std::int64_t ExpertExchange::received() const { return std::accumulate(recv_rows.begin(), recv_rows.end(), std::int64_t{0}); }
std::int64_t ExpertExchange::sent() const { return std::accumulate(send_rows.begin(), send_rows.end(), std::int64_t{0}); }

ExpertExchange plan_expert_exchange(const Tensor& all_counts, int ep, int ep_index) {
  if (ep < 1 || ep_index < 0 || ep_index >= ep || all_counts.dtype() != DType::i64 || all_counts.rank() != 1 ||
      all_counts.numel() % ep != 0 || (all_counts.numel() / ep) % ep != 0) {
    throw std::invalid_argument("plan_expert_exchange: expected i64 [ep * E] counts with ep (" + std::to_string(ep) +
                                ") dividing E and ep index " + std::to_string(ep_index) + " in [0, ep), got " +
                                all_counts.describe());
  }
  const std::int64_t E = all_counts.numel() / ep, n = E / ep;
  const std::int64_t* counts = all_counts.data<std::int64_t>();
  for (std::int64_t i = 0; i < all_counts.numel(); ++i) {
    if (counts[i] < 0) throw std::invalid_argument("plan_expert_exchange: a negative row count");
  }
  ExpertExchange x;
  x.send_rows.assign(static_cast<std::size_t>(ep), 0);
  x.recv_rows.assign(static_cast<std::size_t>(ep), 0);
  const std::int64_t* mine = counts + ep_index * E;
  for (int e = 0; e < ep; ++e) {
    for (std::int64_t k = 0; k < n; ++k) x.send_rows[static_cast<std::size_t>(e)] += mine[e * n + k];
  }
  for (int j = 0; j < ep; ++j) {
    std::vector<std::int64_t> offsets{0};
    for (std::int64_t k = 0; k < n; ++k) offsets.push_back(offsets.back() + counts[j * E + ep_index * n + k]);
    x.recv_rows[static_cast<std::size_t>(j)] = offsets.back();
    x.source_offsets.push_back(std::move(offsets));
  }
  return x;
}

std::vector<std::int64_t> element_counts(const std::vector<std::int64_t>& rows, std::int64_t width) {
  std::vector<std::int64_t> out;
  for (std::int64_t r : rows) out.push_back(r * width);
  return out;
}

}  // namespace atl
