// For families whose ops hand one hidden tensor [T, H] from op to op (Beam, Flint): the staged
// micro-batch run and the plain forward, written once. Ops: embedding, then per layer its
// attention and MLP sublayers, then the head. A family M provides
//   embed_forward / embed_backward, attention_sublayer_forward / _backward and
//   mlp_sublayer_forward / _backward (sharing an M::BlockCache),
//   head_forward / head_backward (with M::HeadCache), M::routing_indices(cache),
//   config().num_hidden_layers and config().is_sparse(layer).
#pragma once
#include <memory>
#include <stdexcept>
#include <vector>

#include "graph/models/token_context.hpp"
#include "graph/training/staged_model.hpp"
#include "kernels/ops/attention.hpp"

namespace atl {

template <class M>
class HiddenStateRun final : public MicroBatchRun {
 public:
  HiddenStateRun(const M& model, const Batch& batch, Precision precision, float grad_scale)
      : model_(model),
        batch_(batch),
        ctx_{batch.positions, batch.valid, batch.rows(), batch.seq_len(), precision},
        grad_scale_(grad_scale),
        blocks_(static_cast<std::size_t>(model.config().num_hidden_layers)) {
    validate_positions(batch.positions);  // MODELS.md §0.3: malformed document positions must throw
  }

  void forward(int op, const TensorMap& w) override {
    switch (model_.op_kind(op)) {
      case OpKind::embedding: hidden_ = model_.embed_forward(w, batch_.input_ids); break;
      case OpKind::attention: {
        const std::int64_t l = model_.op_layer(op);
        auto& cache = blocks_[static_cast<std::size_t>(l)];
        cache = std::make_shared<typename M::BlockCache>();
        hidden_ = model_.attention_sublayer_forward(l, w, hidden_, ctx_, *cache);
        break;
      }
      case OpKind::mlp: {
        const std::int64_t l = model_.op_layer(op);
        auto& cache = blocks_[static_cast<std::size_t>(l)];
        hidden_ = model_.mlp_sublayer_forward(l, w, hidden_, ctx_, *cache);
        if (model_.config().is_sparse(l)) routing_.push_back({l, M::routing_indices(*cache)});
        break;
      }
      case OpKind::final: loss_ = model_.head_forward(w, hidden_, batch_.targets, ctx_, &head_); break;
      case OpKind::layer: throw std::logic_error("hidden-state run: whole-layer ops are split into sublayers");
    }
  }

  void backward(int op, const TensorMap& w, const TensorMap& grads) override {
    switch (model_.op_kind(op)) {
      case OpKind::final:
        grad_ = model_.head_backward(w, *head_, grad_scale_, grads);
        head_.reset();
        break;
      case OpKind::mlp: {
        const std::int64_t l = model_.op_layer(op);
        grad_ = model_.mlp_sublayer_backward(l, w, *blocks_[static_cast<std::size_t>(l)], grad_, ctx_, grads);
        break;
      }
      case OpKind::attention: {
        const std::int64_t l = model_.op_layer(op);
        auto& cache = blocks_[static_cast<std::size_t>(l)];
        grad_ = model_.attention_sublayer_backward(l, w, *cache, grad_, ctx_, grads);
        cache.reset();  // free activations as soon as their backward is done
        break;
      }
      case OpKind::embedding: model_.embed_backward(batch_.input_ids, grad_, grads); break;
      case OpKind::layer: throw std::logic_error("hidden-state run: whole-layer ops are split into sublayers");
    }
  }

  double loss_sum() const override { return loss_.loss_sum; }
  std::int64_t targets() const override { return loss_.targets; }
  std::vector<RoutingRecord> routing() const override { return routing_; }

 private:
  const M& model_;
  Batch batch_;
  TokenContext ctx_;
  float grad_scale_;
  Tensor hidden_, grad_;
  std::vector<std::shared_ptr<typename M::BlockCache>> blocks_;
  std::shared_ptr<typename M::HeadCache> head_;
  LossSum loss_;
  std::vector<RoutingRecord> routing_;
};

// Forward only, keeping no caches.
template <class M>
LossSum hidden_state_forward(const M& model, const TensorMap& w, const Batch& batch, Precision precision,
                             Tensor* logits_out) {
  validate_positions(batch.positions);
  TokenContext ctx{batch.positions, batch.valid, batch.rows(), batch.seq_len(), precision};
  Tensor h = model.embed_forward(w, batch.input_ids);
  for (std::int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
    typename M::BlockCache cache;  // dropped after the layer
    h = model.mlp_sublayer_forward(l, w, model.attention_sublayer_forward(l, w, h, ctx, cache), ctx, cache);
  }
  return model.head_forward(w, h, batch.targets, ctx, nullptr, logits_out);
}

}  // namespace atl
