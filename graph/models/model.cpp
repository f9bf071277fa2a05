#include "graph/models/model.hpp"

#include "graph/models/hf_layout.hpp"

#include "graph/models/beam/model.hpp"
#include "graph/models/beam/model_config.hpp"
#include "graph/models/flint/model.hpp"
#include "graph/models/flint/model_config.hpp"
#include "graph/models/inkling2/model.hpp"
#include "graph/models/inkling2/model_config.hpp"

namespace atl {

nlohmann::json Model::hf_config() const { return with_short_floats(hf_fields()); }

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& s : specs()) n += s.numel();
  return n;
}

LossSum Model::forward_backward(const TensorMap& w, const Batch& batch, Precision precision, float grad_scale,
                                const TensorMap& grads, std::vector<RoutingRecord>* routing) const {
  std::unique_ptr<MicroBatchRun> run = start(batch, precision, grad_scale);
  const int ops = op_count();
  for (int op = 0; op < ops; ++op) run->forward(op, w);
  if (routing) *routing = run->routing();
  for (int op = ops - 1; op >= 0; --op) run->backward(op, w, grads);
  return {run->loss_sum(), run->targets()};
}

namespace {

// Sizes past this many elements (a parameter's, or the model's) are refused: well beyond what
// atoll can train, and far enough below 2^63 that the plan's byte counts cannot overflow.
constexpr std::int64_t kMaxModelElements = std::int64_t{1} << 40;

// The model, refused when its sizes pass kMaxModelElements.
std::shared_ptr<const Model> with_sane_size(std::shared_ptr<const Model> model, const std::string& file) {
  std::int64_t total = 0;
  for (const ParamSpec& s : model->specs()) {
    std::int64_t n = 1;
    bool too_large = false;
    for (std::int64_t d : s.shape) too_large = too_large || __builtin_mul_overflow(n, d, &n) || n > kMaxModelElements;
    too_large = too_large || __builtin_add_overflow(total, n, &total) || total > kMaxModelElements;
    if (too_large) {
      throw ConfigError(file, "model",
                        "sizes too large: " + s.name + " of shape " + shape_string(s.shape) +
                            " takes the model past 2^40 parameters; expected smaller model sizes");
    }
  }
  return model;
}

std::shared_ptr<const Model> model_of_family(const ModelSection& section, const std::string& file) {
  if (section.family == "beam") return std::make_shared<const BeamModel>(beam_config_from(section, file));
  if (section.family == "flint") return std::make_shared<const FlintModel>(flint_config_from(section, file));
  if (section.family == "inkling2") return std::make_shared<const Inkling2Model>(inkling2_config_from(section, file));
  throw ConfigError(file, "model.family",
                    "'" + section.family + "' is not built yet (this build trains: beam, flint, inkling2)");
}

}  // namespace

std::shared_ptr<const Model> make_model(const ModelSection& section, const std::string& file) {
  return with_sane_size(model_of_family(section, file), file);
}

}  // namespace atl
