#include "graph/training/expert_load.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace atl {

void ExpertCounts::add(const std::vector<RoutingRecord>& routing, const Tensor& valid) {
  if (routing.empty()) return;
  if (counts.empty()) counts.assign(routing.size() * static_cast<std::size_t>(experts), 0);
  if (counts.size() != routing.size() * static_cast<std::size_t>(experts)) {
    throw std::logic_error("expert load: " + std::to_string(routing.size()) + " MoE layers after " +
                           std::to_string(counts.size() / static_cast<std::size_t>(experts)));
  }
  const bool* mask = valid.data<bool>();
  for (std::size_t layer = 0; layer < routing.size(); ++layer) {
    const Tensor& indices = routing[layer].indices;
    const std::int64_t tokens = indices.size(0), k = indices.size(1);
    if (tokens != valid.numel()) throw std::logic_error("expert load: routing and mask disagree on the token count");
    std::int64_t* row = counts.data() + layer * static_cast<std::size_t>(experts);
    const std::int32_t* chosen = indices.data<std::int32_t>();
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (!mask[t]) continue;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t e = chosen[t * k + j];
        if (e < 0 || e >= experts) throw std::logic_error("expert load: expert " + std::to_string(e) + " out of range");
        ++row[e];
      }
    }
  }
}

void ExpertCounts::add(const std::vector<std::int64_t>& other) {
  if (other.empty()) return;
  if (counts.empty()) counts.assign(other.size(), 0);
  if (other.size() != counts.size()) throw std::logic_error("expert load: ranks report different layouts");
  for (std::size_t i = 0; i < other.size(); ++i) counts[i] += other[i];
}

std::vector<double> ExpertCounts::max_over_mean() const {
  std::vector<double> out;
  if (experts <= 0) return out;
  for (std::size_t first = 0; first < counts.size(); first += static_cast<std::size_t>(experts)) {
    const auto begin = counts.begin() + static_cast<std::ptrdiff_t>(first), end = begin + experts;
    std::int64_t total = 0;
    for (auto it = begin; it != end; ++it) total += *it;
    const double mean = static_cast<double>(total) / static_cast<double>(experts);
    out.push_back(total > 0 ? static_cast<double>(*std::max_element(begin, end)) / mean : 0.0);
  }
  return out;
}

}  // namespace atl
