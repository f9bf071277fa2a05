#include "graph/data/batch.hpp"

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
