// A model family as the trainers, the planner and the apps see it: parameter specs, the staged
// ops the runtime executes, and the sharding rules of the family's parallelizer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/config.hpp"
#include "graph/param.hpp"
#include "graph/plan/plan.hpp"
#include "graph/tensor_meta.hpp"
#include "graph/training/staged_model.hpp"

namespace atl {

class Model : public StagedModel {
 public:
  virtual std::string family() const = 0;
  virtual std::string preset() const = 0;
  virtual const std::vector<ParamSpec>& specs() const = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int64_t unpadded_vocab_size() const = 0;
  virtual float init_std() const = 0;

  virtual FamilyShardingRules sharding_rules() const = 0;
  // The tensors one micro-batch (rows x seq tokens per rank) sends across a pipeline cut before
  // decoder layer `cut` (MODELS.md §5.6): the family's boundary metas, from its parallelize.hpp.
  virtual std::vector<TensorMeta> pipeline_boundary(std::int64_t cut, std::int64_t rows, std::int64_t seq,
                                                    Precision precision) const = 0;
  // Forward only; logits_out gets the fp32 logits [B, S, V] the loss sees.
  virtual LossSum forward(const TensorMap& w, const Batch& batch, Precision precision,
                          Tensor* logits_out = nullptr) const = 0;

  // --- HF interop (MODELS.md §5.8) ---
  // config.json of the HF checkpoint layout: the family's fields, floats in their shortest form
  // (0.02, not the float widened to 0.019999999552965164).
  nlohmann::json hf_config() const;
  // State-dict adapters between atoll's native layout (specs()) and the HF layout. Dtypes are
  // preserved tensor by tensor; from_hf(to_hf(x)) == x bitwise. Errors name the tensor.
  virtual TensorMap to_hf(const TensorMap& native) const = 0;
  virtual TensorMap from_hf(const TensorMap& hf) const = 0;

  std::int64_t parameter_count() const;

 protected:
  // The family's config.json fields (hf_config() tidies their numbers).
  virtual nlohmann::json hf_fields() const = 0;

 public:
  // Forward and backward of one micro-batch through the staged ops; gradients of
  // grad_scale * loss_sum are accumulated into grads.
  LossSum forward_backward(const TensorMap& w, const Batch& batch, Precision precision, float grad_scale,
                           const TensorMap& grads, std::vector<RoutingRecord>* routing = nullptr) const;
};

// The model a run config's `model:` section names (family, preset, overrides). Throws
// ConfigError naming the file and the model.* key.
std::shared_ptr<const Model> make_model(const ModelSection& section, const std::string& file);

}  // namespace atl
