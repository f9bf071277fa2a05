#include "graph/data/batch.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace atl {

Batch Batch::zeros(std::int64_t rows, std::int64_t seq) {
  Batch b;
  b.input_ids = Tensor::zeros({rows, seq}, DType::i64);
  b.positions = Tensor::zeros({rows, seq}, DType::i64);
  b.valid = Tensor::zeros({rows, seq}, DType::boolean);
  b.targets = Tensor::zeros({rows, seq}, DType::i64);
  return b;
}

Batch Batch::slice_rows(std::int64_t begin, std::int64_t end) const {
  return Batch{input_ids.slice_rows(begin, end), positions.slice_rows(begin, end), valid.slice_rows(begin, end),
               targets.slice_rows(begin, end)};
}

Batch Batch::concat_rows(const std::vector<Batch>& parts) {
  if (parts.empty()) throw std::invalid_argument("Batch::concat_rows: no parts");
  if (parts.size() == 1) return parts.front();
  const std::int64_t seq = parts.front().seq_len();
  std::int64_t rows = 0;
  for (const Batch& p : parts) {
    if (p.seq_len() != seq) {
      throw std::invalid_argument("Batch::concat_rows: rows of " + std::to_string(p.seq_len()) + " and " +
                                  std::to_string(seq) + " tokens");
    }
    rows += p.rows();
  }
  Batch out = zeros(rows, seq);
  std::size_t offset[4] = {0, 0, 0, 0};  // bytes written per tensor
  for (const Batch& p : parts) {
    const Tensor from[4] = {p.input_ids, p.positions, p.valid, p.targets};
    const Tensor to[4] = {out.input_ids, out.positions, out.valid, out.targets};
    for (int k = 0; k < 4; ++k) {
      std::memcpy(static_cast<char*>(to[k].raw()) + offset[k], from[k].raw(), from[k].bytes());
      offset[k] += from[k].bytes();
    }
  }
  return out;
}

std::int64_t Batch::target_count() const {
  std::int64_t n = 0;
  for (std::int64_t t : targets.span<std::int64_t>()) n += t != kIgnoreTarget;
  return n;
}

std::int64_t Batch::valid_count() const {
  std::int64_t n = 0;
  for (bool v : valid.span<bool>()) n += v;
  return n;
}

}  // namespace atl
