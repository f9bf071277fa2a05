// The families whose state between ops is the hidden tensor [T, H] (Beam, Flint): besides
// FamilyModel's, they share the embedding (a plain lookup of model.embed_tokens), the final norm
// and lm_head (lm_head.hpp, as the family's head_spec() says), the layer names and the activation
// shapes. Derived is the family's model (it provides head_spec()).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/models/family_model.hpp"
#include "graph/models/lm_head.hpp"
#include "graph/models/sublayer_run.hpp"
#include "graph/models/token_context.hpp"

namespace atl {

template <class Derived, class Config>
class HiddenStateModel : public FamilyModel<Config> {
 public:
  using State = Tensor;
  using StateGrad = Tensor;
  using EmbedCache = TokenIdsCache;
  using HeadCache = LmHeadCache;
  static constexpr bool kResidualMixOps = false;  // the input norms run inside attention and router

  static std::string layer_prefix(std::int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

  Tensor embed_forward(const TensorMap& w, const Tensor& input_ids, const TokenContext& /*ctx*/,
                       std::shared_ptr<TokenIdsCache>* cache) const {
    return token_embedding_forward(w.at("model.embed_tokens.weight"), input_ids, cache);
  }
  void embed_backward(const TensorMap& /*w*/, const TokenIdsCache& cache, const Tensor& d_hidden,
                      const TensorMap& grads) const {
    token_embedding_backward(cache, d_hidden, grads.at("model.embed_tokens.weight"));
  }

  // Final norm and lm_head: the logits f32 [T, V] (the loss op: lm_loss_forward with head_spec()).
  Tensor head_forward(const TensorMap& w, const Tensor& hidden, const TokenContext& ctx,
                      std::shared_ptr<LmHeadCache>* cache_out) const {
    auto cache = std::make_shared<LmHeadCache>();
    Tensor logits = lm_head_forward(w, derived().head_spec(), hidden, ctx, *cache);
    if (cache_out) *cache_out = std::move(cache);
    return logits;
  }
  // d_logits -> d_hidden.
  Tensor head_backward(const TensorMap& w, const LmHeadCache& cache, const Tensor& d_logits,
                       const TensorMap& grads) const {
    return lm_head_backward(w, derived().head_spec(), cache, d_logits, grads);
  }

  std::map<std::string, std::vector<TensorMeta>> activation_metas(std::int64_t rows, std::int64_t seq) const override {
    const Config& c = this->config_;
    return this->sublayer_metas(hidden_state_shapes(c.hidden_size, c.vocab_size, c.num_experts_per_tok), rows, seq);
  }

 protected:
  using FamilyModel<Config>::FamilyModel;

 private:
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
};

}  // namespace atl
