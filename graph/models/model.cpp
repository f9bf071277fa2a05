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

std::shared_ptr<const Model> make_model(const ModelSection& section, const std::string& file) {
  if (section.family == "beam") return std::make_shared<const BeamModel>(beam_config_from(section, file));
  if (section.family == "flint") return std::make_shared<const FlintModel>(flint_config_from(section, file));
  if (section.family == "inkling2") {
    return std::make_shared<const Inkling2Model>(inkling2_config_from(section, file));
  }
  throw ConfigError(file, "model.family",
                    "'" + section.family + "' is not built yet (this build trains: beam, flint, inkling2)");
}

}  // namespace atl
