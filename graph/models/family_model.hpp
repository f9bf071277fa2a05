// What the three families' models share: the config, the parameter specs and the sublayer ops
// they split into, and the Model overrides that only read those. A family's constructor fills
// specs_ and then calls split_into_ops.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/models/model.hpp"
#include "graph/training/staged_model.hpp"

namespace atl {

template <class Config>
class FamilyModel : public Model {
 public:
  const Config& config() const { return config_; }

  std::string preset() const override { return config_.preset; }
  const std::vector<ParamSpec>& specs() const override { return specs_; }
  const std::vector<OpSpec>& ops() const override { return ops_; }
  std::int64_t vocab_size() const override { return config_.vocab_size; }
  std::int64_t unpadded_vocab_size() const override { return config_.unpadded_vocab_size; }
  float init_std() const override { return config_.init_std; }

 protected:
  explicit FamilyModel(Config config) : config_(std::move(config)) { config_.validate(); }

  // The runtime's ops: specs_ (complete by now) split per layer as `split` says; `state` names
  // what flows between the ops ("hidden" or "state").
  void split_into_ops(SublayerSplit split, std::string state) {
    split_ = std::move(split);
    state_ = std::move(state);
    ops_ = sublayer_ops(specs_, sharding_rules(), config_.num_hidden_layers, state_, split_);
  }
  std::map<std::string, std::vector<TensorMeta>> sublayer_metas(const ActivationShapes& shapes, std::int64_t rows,
                                                                std::int64_t seq) const {
    return sublayer_activation_metas(shapes, config_.num_hidden_layers, state_, split_, rows, seq);
  }

  Config config_;
  std::vector<ParamSpec> specs_;

 private:
  std::vector<OpSpec> ops_;
  SublayerSplit split_;  // how a layer splits into ops (sublayer_ops, activation_metas)
  std::string state_;
};

}  // namespace atl
