// One batch of packed causal-LM rows. Targets are already shifted: targets[b, t] is the token that
// the model's output at (b, t) must predict, or kIgnoreTarget.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/tensor.hpp"

namespace atl {

// Target value that the loss skips (PyTorch's ignore_index).
inline constexpr std::int64_t kIgnoreTarget = -100;

// Rows [begin, end) of a batch.
struct RowRange {
  std::int64_t begin = 0, end = 0;
  bool operator==(const RowRange&) const = default;
};

struct Batch {
  Tensor input_ids;  // i64 [B, S]
  Tensor positions;  // i64 [B, S]: offset inside the token's document (0 at a document start)
  Tensor valid;      // bool [B, S]: false for padding
  Tensor targets;    // i64 [B, S]: next token of the same document, else kIgnoreTarget

  // Four tensors of shape [rows, seq], zero-filled.
  static Batch zeros(std::int64_t rows, std::int64_t seq);

  std::int64_t rows() const { return input_ids.size(0); }
  std::int64_t seq_len() const { return input_ids.size(1); }
  // Rows [begin, end), sharing storage with this batch.
  Batch slice_rows(std::int64_t begin, std::int64_t end) const;
  // The parts' rows in order (one part: that batch itself); every part has the same seq_len.
  static Batch concat_rows(const std::vector<Batch>& parts);
  // Number of targets the loss scores (not kIgnoreTarget).
  std::int64_t target_count() const;
  // Number of real (non-padding) tokens.
  std::int64_t valid_count() const;
};

}  // namespace atl
