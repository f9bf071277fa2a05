#include "graph/eval/evaluate.hpp"

#include <cmath>

#include <fmt/format.h>

#include "graph/checkpoint/checkpoint_dir.hpp"
#include "graph/checkpoint/model_weights.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "kernels/cpu/compute_pool.hpp"
#include "kernels/ops/attention.hpp"

namespace atl {

EvalResult evaluate(const Model& model, const TensorMap& master, Precision precision, DataSource& data,
                    std::int64_t rows, std::int64_t seq, std::int64_t batches) {
  cpu::ComputePool pool(cpu::default_compute_threads(1));  // results do not depend on the count
  cpu::ComputePoolScope scope(&pool);
  const TensorMap weights = compute_weights(model.specs(), master, precision);
  double loss_sum = 0;
  EvalResult r;
  for (std::int64_t b = 0; b < batches; ++b) {
    if (b > 0 && data.used_up()) break;  // data.loop: false, and nothing left to score: fewer batches
    LossSum l = model.forward(weights, data.next(rows, seq), precision);
    loss_sum += l.loss_sum;
    r.targets += l.targets;
    ++r.batches;
  }
  r.loss = r.targets > 0 ? loss_sum / static_cast<double>(r.targets) : 0.0;
  r.perplexity = std::exp(r.loss);
  return r;
}

Batch read_token_rows(const std::filesystem::path& file, std::int64_t usable_vocab) {
  SafetensorsContents c = read_safetensors(file);
  auto get = [&](const char* name, DType dtype) -> Tensor {
    if (!c.tensors.contains(name)) throw CheckpointError(file.string() + ": no tensor '" + name + "'");
    const Tensor& t = c.tensors.at(name);
    if (t.dtype() != dtype || t.rank() != 2) {
      throw CheckpointError(file.string() + ": tensor '" + name + "' is " + t.describe() + ", expected " +
                            std::string(dtype_name(dtype)) + "[batch, seq]");
    }
    return t;
  };
  Batch batch;
  batch.input_ids = get("input_ids", DType::i64);
  batch.positions = get("positions", DType::i64);
  batch.valid = get("valid", DType::boolean);
  if (batch.positions.shape() != batch.input_ids.shape() || batch.valid.shape() != batch.input_ids.shape()) {
    throw CheckpointError(file.string() + ": input_ids, positions and valid must share one shape");
  }
  // (An empty dimension holds no token to score; beside it the other could claim any size.)
  if (batch.input_ids.size(0) < 1 || batch.input_ids.size(1) < 1) {
    throw CheckpointError(file.string() + ": input_ids is " + batch.input_ids.describe() +
                          "; expected at least one row of at least one token");
  }
  const auto ids = batch.input_ids.span<std::int64_t>();
  const std::size_t seq = static_cast<std::size_t>(batch.input_ids.size(1));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= usable_vocab) {  // named as [row, column], as the file's users index it
      throw CheckpointError(fmt::format("{}: input_ids[{}, {}] = {} is outside the usable vocabulary [0, {})",
                                        file.string(), i / seq, i % seq, ids[i], usable_vocab));
    }
  }
  try {
    validate_positions(batch.positions);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(file.string() + ": positions: " + e.what());
  }
  batch.targets = Tensor::empty(batch.input_ids.shape(), DType::i64);
  for (auto& t : batch.targets.span<std::int64_t>()) t = kIgnoreTarget;
  return batch;
}

Tensor model_logits(const Model& model, const TensorMap& master, Precision precision, const Batch& rows) {
  cpu::ComputePool pool(cpu::default_compute_threads(1));
  cpu::ComputePoolScope scope(&pool);
  Tensor logits;
  model.forward(compute_weights(model.specs(), master, precision), rows, precision, &logits);
  return logits;
}

TensorMap checkpoint_weights(const Model& model, const std::filesystem::path& checkpoint_dir, bool allow_nonfinite,
                             bool allow_model_change) {
  CheckpointLoadOptions options;
  options.allow_nonfinite = allow_nonfinite;
  const CheckpointContents checkpoint = load_checkpoint(checkpoint_dir, options);
  TensorMap weights = model_weights_from(model, checkpoint, checkpoint_dir.string());  // the family first
  if (const std::string changes = model_config_changes(model, checkpoint); !changes.empty() && !allow_model_change) {
    throw CheckpointError(fmt::format("{}: the checkpoint's model (config.json) differs from the config's: {} "
                                      "(the checkpoint's value first); set those model keys to the checkpoint's "
                                      "values, or pass --allow-model-change to score it under the config's",
                                      checkpoint_dir.string(), changes));
  }
  return weights;
}

}  // namespace atl
