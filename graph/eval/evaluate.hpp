// Evaluation (atoll-eval): loss and perplexity of a model over a data source, and the fp32
// logits of given token rows.
#pragma once
#include <cstdint>
#include <filesystem>

#include "graph/data/data_source.hpp"
#include "graph/models/model.hpp"

namespace atl {

struct EvalResult {
  double loss = 0;        // mean cross entropy per target token (nats)
  double perplexity = 0;  // exp(loss)
  std::int64_t targets = 0;
  std::int64_t batches = 0;
};

// `batches` batches of rows x seq from `data`, forward only, in the given precision.
EvalResult evaluate(const Model& model, const TensorMap& master, Precision precision, DataSource& data,
                    std::int64_t rows, std::int64_t seq, std::int64_t batches);

// Rows to score, from a safetensors file with `input_ids` (i64 [B,S]), `positions` (i64 [B,S]) and
// `valid` (bool [B,S]); errors name the file and the tensor. Token ids must be below usable_vocab
// and positions follow MODELS.md §0.3. Targets are all ignored.
Batch read_token_rows(const std::filesystem::path& file, std::int64_t usable_vocab);

// fp32 logits [B, S, V] of the rows (after the family's softcap; columns >= Vu are -inf).
Tensor model_logits(const Model& model, const TensorMap& master, Precision precision, const Batch& rows);

// The masters of a training checkpoint, checked against the model. A checkpoint whose model
// settings (config.json) differ from `model`'s is refused (CheckpointError naming them: its loss
// under another model's settings is no loss of either) unless allow_model_change.
TensorMap checkpoint_weights(const Model& model, const std::filesystem::path& checkpoint_dir,
                             bool allow_nonfinite = false, bool allow_model_change = false);

}  // namespace atl
