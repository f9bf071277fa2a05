// The staged micro-batch run and the plain forward of every family, written once. Ops
// (graph/training/staged_model.hpp sublayer_ops): embedding; per layer its attention sublayer,
// then its dense MLP or the MoE steps router -> dispatch -> experts -> combine
// (graph/models/moe_mlp.hpp); the head. What flows between ops is the family's M::State (Beam,
// Flint: the hidden tensor [T, H]; Inkling2: its residual depth state) and, backward, M::StateGrad.
// A family M provides:
//   types State, StateGrad, EmbedCache, BlockCache (members `mlp_in`: the MLP input, set by
//   mlp_input_forward; `moe`: MoeMlpCache; `dense`: DenseMlpCache), HeadCache;
//   embed_forward(w, input_ids, ctx, shared_ptr<EmbedCache>*) -> State, embed_backward(w, cache, d, grads);
//   attention_sublayer_forward(l, w, State, ctx, BlockCache&) -> State (the mid state),
//   attention_sublayer_backward(l, w, cache, d_mid, ctx, grads) -> StateGrad;
//   the MLP's surroundings mlp_input_forward(l, w, mid, ctx, k) -> Tensor (the MLP input) and
//   mlp_output_forward(l, w, m, ctx, k) -> State (the MLP output m back into the state), with
//   mlp_output_backward(l, w, k, d_out, ctx, grads) -> MlpOutputGrads<StateGrad> and
//   mlp_input_backward(l, w, k, d_x, d_residual, grads) -> StateGrad;
//   head_forward(w, State, ctx, shared_ptr<HeadCache>*) -> the logits f32 [T, V],
//   head_backward(w, cache, d_logits, grads) -> StateGrad, and head_spec() (the loss op's
//   softcap, vocabulary and mask: graph/models/lm_head.hpp);
//   moe_spec(), layer_prefix(l), static routing_indices(cache), config().num_hidden_layers and
//   config().is_sparse(l).
#pragma once
#include <memory>
#include <stdexcept>
#include <vector>

#include "graph/models/dense_mlp.hpp"
#include "graph/models/moe_mlp.hpp"
#include "graph/models/token_context.hpp"
#include "graph/training/staged_model.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/embedding.hpp"

namespace atl {

// The MLP output's backward hands on two gradients: at the MLP output, and the residual's share
// of the mid state's gradient (added to by the MLP input's backward).
template <class StateGrad>
struct MlpOutputGrads {
  Tensor d_m;
  StateGrad d_residual;
};

// The tensors of a hidden-tensor state (Beam, Flint), as the op graph's metas list them.
inline std::vector<Tensor> state_tensors(const Tensor& hidden) { return {hidden}; }
// The activation shapes of a hidden-tensor family: the state is hidden f32 [T, H] everywhere.
inline ActivationShapes hidden_state_shapes(std::int64_t hidden, std::int64_t vocab, std::int64_t top_k) {
  ActivationShapes a;
  a.hidden = hidden;
  a.vocab = vocab;
  a.top_k = [top_k](std::int64_t) { return top_k; };
  a.state = [hidden](std::int64_t, bool, std::int64_t tokens) {
    return std::vector<TensorMeta>{{"hidden", {tokens, hidden}, DType::f32}};
  };
  return a;
}

// The embedding of a family whose embedding is a plain table lookup (a bf16 lookup is exact),
// and what its backward needs.
struct TokenIdsCache {
  Tensor input_ids;  // i64 [T]
};
inline Tensor token_embedding_forward(const Tensor& table, const Tensor& input_ids,
                                      std::shared_ptr<TokenIdsCache>* cache) {
  Tensor ids = input_ids.reshape({input_ids.numel()});
  if (cache) *cache = std::make_shared<TokenIdsCache>(TokenIdsCache{ids});
  return embedding_forward(table, ids);
}
inline void token_embedding_backward(const TokenIdsCache& cache, const Tensor& d_hidden, const Tensor& d_table) {
  embedding_backward(d_hidden, cache.input_ids, d_table);
}

// The whole MLP sublayer, mid state -> block output (the plain forward and a dense layer's op).
template <class M>
typename M::State mlp_sublayer_forward(const M& model, std::int64_t l, const TensorMap& w,
                                       const typename M::State& h_mid, const TokenContext& ctx,
                                       typename M::BlockCache& k) {
  const Tensor x = model.mlp_input_forward(l, w, h_mid, ctx, k);
  const Tensor m = model.config().is_sparse(l)
                       ? moe_mlp_forward(model.layer_prefix(l), w, x, ctx.valid.reshape({ctx.tokens()}),
                                         model.moe_spec(), ctx.precision, k.moe)
                       : dense_mlp_forward(model.layer_prefix(l), w, x, ctx.precision, k.dense);
  return model.mlp_output_forward(l, w, m, ctx, k);
}

// The backward of a dense MLP sublayer (an MoE layer's backward runs as its four ops).
template <class M>
typename M::StateGrad dense_mlp_sublayer_backward(const M& model, std::int64_t l, const TensorMap& w,
                                                  const typename M::BlockCache& k, const typename M::StateGrad& d_out,
                                                  const TokenContext& ctx, const TensorMap& grads) {
  const auto g = model.mlp_output_backward(l, w, k, d_out, ctx, grads);
  const Tensor d_x = dense_mlp_backward(model.layer_prefix(l), w, k.mlp_in, g.d_m, ctx.precision, k.dense, grads);
  return model.mlp_input_backward(l, w, k, d_x, g.d_residual, grads);
}

template <class M>
class SublayerRun final : public MicroBatchRun {
 public:
  SublayerRun(const M& model, const Batch& batch, Precision precision, float grad_scale)
      : model_(model),
        batch_(batch),
        ctx_{batch.positions, batch.valid, batch.rows(), batch.seq_len(), precision},
        grad_scale_(grad_scale),
        blocks_(static_cast<std::size_t>(model.config().num_hidden_layers)),
        moe_backward_(blocks_.size()),
        groups_(blocks_.size()),
        metas_(model.activation_metas(batch.rows(), batch.seq_len())) {
    validate_positions(batch.positions);  // MODELS.md §0.3: malformed document positions must throw
  }

  void forward(int op, const TensorMap& w) override {
    run_forward(op, w);
    check_outputs(op);
  }

  void backward(int op, const TensorMap& w, const TensorMap& grads) override {
    const std::int64_t l = model_.op_layer(op);
    const Precision prec = ctx_.precision;
    switch (model_.op_kind(op)) {
      case OpKind::loss:
        d_logits_ = lm_loss_backward(model_.head_spec(), *loss_cache_, grad_scale_);
        loss_cache_.reset();
        break;
      case OpKind::head:
        grad_ = model_.head_backward(w, *head_, d_logits_, grads);
        head_.reset();
        d_logits_ = {};
        break;
      case OpKind::mlp:
        grad_ = dense_mlp_sublayer_backward(model_, l, w, *block(l), grad_, ctx_, grads);
        break;
      case OpKind::combine: {
        auto g = model_.mlp_output_backward(l, w, *block(l), grad_, ctx_, grads);
        residual_grad_ = std::move(g.d_residual);
        moe_combine_backward(g.d_m, model_.moe_spec(), prec, block(l)->moe, moe_grad(l));
        break;
      }
      case OpKind::experts:
        moe_experts_backward(model_.layer_prefix(l), w, model_.moe_spec(), prec, block(l)->moe, moe_grad(l), grads);
        break;
      case OpKind::shared_expert:
        moe_shared_backward(model_.layer_prefix(l), w, prec, block(l)->moe, moe_grad(l), grads);
        break;
      case OpKind::dispatch:
        moe_dispatch_backward(model_.moe_spec(), prec, block(l)->moe, moe_grad(l));
        break;
      case OpKind::router: {
        const Tensor d_x =
            moe_route_backward(model_.layer_prefix(l), w, model_.moe_spec(), block(l)->moe, moe_grad(l), grads);
        moe_grad(l) = {};
        if constexpr (M::kResidualMixOps) {
          mix_grad_ = d_x;  // the mlp_mix op's backward takes it
        } else {
          grad_ = model_.mlp_input_backward(l, w, *block(l), d_x, residual_grad_, grads);
          residual_grad_ = {};
        }
        break;
      }
      case OpKind::mlp_mix:
        if constexpr (M::kResidualMixOps) {
          grad_ = model_.mlp_input_backward(l, w, *block(l), mix_grad_, residual_grad_, grads);
          residual_grad_ = {};
          mix_grad_ = {};
          break;
        }
        throw std::logic_error("sublayer run: this family has no mix ops");
      case OpKind::attention:
        if constexpr (M::kResidualMixOps) {
          grad_ = model_.attention_core_backward(l, w, *block(l), grad_, ctx_, grads, attn_in_grad_);
        } else {
          grad_ = model_.attention_sublayer_backward(l, w, *block(l), grad_, ctx_, grads);
          block(l).reset();  // free activations as soon as their backward is done
        }
        break;
      case OpKind::attention_mix:
        if constexpr (M::kResidualMixOps) {
          grad_ = model_.attention_mix_backward(l, w, *block(l), attn_in_grad_, grad_, grads);
          attn_in_grad_.clear();
          block(l).reset();  // the layer's first op: its activations are done
          break;
        }
        throw std::logic_error("sublayer run: this family has no mix ops");
      case OpKind::embedding:
        model_.embed_backward(w, *embed_, grad_, grads);
        embed_.reset();
        break;
    }
  }

  // Expert parallelism: the experts op as an exchange (MicroBatchRun).
  ExpertRowsOut expert_rows(int op) override {
    MoeMlpCache& k = experts_block(op, "expert_rows")->moe;
    ExpertRowsOut out{std::move(k.rows.x_rows), std::move(k.rows.w_rows), {}, k.x, k.dispatch.indices,
                      k.dispatch.weights, ctx_.valid.reshape({ctx_.tokens()}), k.dispatch.row_pair};
    k.rows = {};
    const auto offsets = k.dispatch.expert_offsets.span<std::int64_t>();
    for (std::size_t e = 0; e + 1 < offsets.size(); ++e) out.expert_rows.push_back(offsets[e + 1] - offsets[e]);
    return out;
  }
  void set_expert_output(int op, Tensor down_out) override {
    experts_block(op, "set_expert_output")->moe.experts.down_out = std::move(down_out);
    check_outputs(op);
  }
  Tensor expert_output_grad(int op) override {
    experts_block(op, "expert_output_grad");
    return std::move(moe_grad(model_.op_layer(op)).combined.d_rows);
  }
  void set_expert_input_grads(int op, ExpertRowGrads g) override {
    experts_block(op, "set_expert_input_grads");
    moe_grad(model_.op_layer(op)).d_rows = {std::move(g.d_x_rows), std::move(g.d_w_rows)};
  }
  Tensor expert_group_forward(int op, const TensorMap& w, std::vector<ExpertSourceRows> sources) override {
    experts_block(op, "expert_group_forward");
    const std::int64_t l = model_.op_layer(op);
    return moe_expert_group_forward(model_.layer_prefix(l), w, model_.moe_spec(), ctx_.precision, std::move(sources),
                                    groups_[static_cast<std::size_t>(l)]);
  }
  ExpertRowGrads expert_group_backward(int op, const TensorMap& w, const Tensor& d_rows,
                                       const std::vector<TensorMap>& grads) override {
    experts_block(op, "expert_group_backward");
    const std::int64_t l = model_.op_layer(op);
    ExpertGroupCache& group = groups_[static_cast<std::size_t>(l)];
    ExpertRowGrads out = moe_expert_group_backward(model_.layer_prefix(l), w, model_.moe_spec(), ctx_.precision, group,
                                                   d_rows, grads);
    group = {};
    return out;
  }

  double loss_sum() const override { return loss_.loss_sum; }
  std::int64_t targets() const override { return loss_.targets; }
  std::vector<RoutingRecord> routing() const override { return routing_; }

 private:
  void run_forward(int op, const TensorMap& w) {
    const std::int64_t l = model_.op_layer(op);
    const Precision prec = ctx_.precision;
    switch (model_.op_kind(op)) {
      case OpKind::embedding:
        state_ = model_.embed_forward(w, batch_.input_ids, ctx_, &embed_);
        break;
      case OpKind::attention_mix:
        if constexpr (M::kResidualMixOps) {
          block(l) = std::make_shared<typename M::BlockCache>();
          attn_in_ = model_.attention_mix_forward(l, w, state_, ctx_, *block(l));
          break;
        }
        throw std::logic_error("sublayer run: this family has no mix ops");
      case OpKind::attention:
        if constexpr (M::kResidualMixOps) {
          state_ = model_.attention_core_forward(l, w, state_, ctx_, *block(l));
          attn_in_.clear();
        } else {
          block(l) = std::make_shared<typename M::BlockCache>();
          state_ = model_.attention_sublayer_forward(l, w, state_, ctx_, *block(l));
        }
        break;
      case OpKind::mlp_mix:
        if constexpr (M::kResidualMixOps) {
          model_.mlp_input_forward(l, w, state_, ctx_, *block(l));  // block(l)->mlp_in: the router's input
          break;
        }
        throw std::logic_error("sublayer run: this family has no mix ops");
      case OpKind::mlp:
        state_ = mlp_sublayer_forward(model_, l, w, state_, ctx_, *block(l));
        break;
      case OpKind::router: {
        const Tensor x = M::kResidualMixOps ? block(l)->mlp_in : model_.mlp_input_forward(l, w, state_, ctx_, *block(l));
        moe_route_forward(model_.layer_prefix(l), w, x, ctx_.valid.reshape({ctx_.tokens()}), model_.moe_spec(), prec,
                          block(l)->moe);
        routing_.push_back({l, M::routing_indices(*block(l))});
        break;
      }
      case OpKind::dispatch:
        moe_dispatch_forward(block(l)->moe);
        break;
      case OpKind::shared_expert:
        moe_shared_forward(model_.layer_prefix(l), w, prec, block(l)->moe);
        break;
      case OpKind::experts:
        moe_experts_forward(model_.layer_prefix(l), w, model_.moe_spec(), prec, block(l)->moe);
        break;
      case OpKind::combine: {
        const Tensor m = moe_combine_forward(model_.moe_spec(), prec, block(l)->moe);
        state_ = model_.mlp_output_forward(l, w, m, ctx_, *block(l));
        break;
      }
      case OpKind::head:
        logits_ = model_.head_forward(w, state_, ctx_, &head_);
        state_ = {};
        break;
      case OpKind::loss:
        loss_cache_ = std::make_shared<LmLossCache>();
        loss_ = lm_loss_forward(model_.head_spec(), logits_, batch_.targets, ctx_, *loss_cache_);
        logits_ = {};  // the loss keeps what its backward needs
        break;
    }
  }

  // What op's forward wrote, per output (OpSpec order), checked against the op graph's metas.
  std::vector<std::vector<Tensor>> outputs(int op) const {
    const std::int64_t l = model_.op_layer(op);
    switch (model_.op_kind(op)) {
      case OpKind::embedding:
      case OpKind::attention:
      case OpKind::mlp:
      case OpKind::combine:
        return {state_tensors(state_)};
      case OpKind::attention_mix: return {attn_in_};
      case OpKind::mlp_mix: return {{blocks_[static_cast<std::size_t>(l)]->mlp_in}};
      case OpKind::router: {
        const MoeMlpCache& k = blocks_[static_cast<std::size_t>(l)]->moe;
        if (M::kResidualMixOps) return {{k.routing.indices, k.routing.weights}};  // x came from mlp_mix
        return {{k.x}, {k.routing.indices, k.routing.weights}};
      }
      case OpKind::dispatch: {
        const MoeMlpCache& k = blocks_[static_cast<std::size_t>(l)]->moe;
        return {{k.rows.x_rows, k.rows.w_rows}};
      }
      case OpKind::shared_expert: return {{blocks_[static_cast<std::size_t>(l)]->moe.shared_out}};
      case OpKind::experts: return {{blocks_[static_cast<std::size_t>(l)]->moe.experts.down_out}};
      case OpKind::head: return {{logits_}};
      case OpKind::loss: return {{}};
    }
    return {};
  }

  void check_outputs(int op) const {
    const OpSpec& spec = model_.ops()[static_cast<std::size_t>(op)];
    const std::vector<std::vector<Tensor>> produced = outputs(op);
    for (std::size_t i = 0; i < spec.outputs.size(); ++i) {
      const std::string mismatch = meta_mismatch(produced.at(i), metas_.at(spec.outputs[i]));
      if (!mismatch.empty()) {
        throw std::logic_error("op " + spec.name + ": output '" + spec.outputs[i] + "': " + mismatch);
      }
    }
  }

  std::shared_ptr<typename M::BlockCache>& block(std::int64_t l) { return blocks_[static_cast<std::size_t>(l)]; }
  // The block of an experts op whose forward has started (the router made it).
  std::shared_ptr<typename M::BlockCache>& experts_block(int op, const char* what) {
    if (model_.op_kind(op) != OpKind::experts || !block(model_.op_layer(op))) {
      throw std::logic_error(std::string("sublayer run: ") + what + " of op " + std::to_string(op) +
                             ", which is not a started experts op");
    }
    return block(model_.op_layer(op));
  }
  MoeMlpBackward& moe_grad(std::int64_t l) { return moe_backward_[static_cast<std::size_t>(l)]; }

  const M& model_;
  Batch batch_;
  TokenContext ctx_;
  float grad_scale_;
  typename M::State state_;  // the residual stream between ops (Inkling2: completed blocks + partial)
  typename M::StateGrad grad_;
  typename M::StateGrad residual_grad_;  // an MoE layer's residual share of d mid, from combine to router
  std::vector<Tensor> attn_in_, attn_in_grad_;  // mix ops: attention's inputs, and their gradients
  Tensor mix_grad_;                             // mix ops: d x, from the router to mlp_mix
  std::shared_ptr<typename M::EmbedCache> embed_;
  std::vector<std::shared_ptr<typename M::BlockCache>> blocks_;
  std::vector<MoeMlpBackward> moe_backward_;
  std::vector<ExpertGroupCache> groups_;  // expert parallelism: this rank's experts' work, per layer
  std::shared_ptr<typename M::HeadCache> head_;
  Tensor logits_, d_logits_;  // between the head and loss ops
  std::shared_ptr<LmLossCache> loss_cache_;
  LossSum loss_;
  std::vector<RoutingRecord> routing_;
  std::map<std::string, std::vector<TensorMeta>> metas_;  // the op graph's activations for this micro-batch
};

// Forward only, keeping no caches.
template <class M>
LossSum sublayer_forward(const M& model, const TensorMap& w, const Batch& batch, Precision precision,
                         Tensor* logits_out) {
  validate_positions(batch.positions);
  TokenContext ctx{batch.positions, batch.valid, batch.rows(), batch.seq_len(), precision};
  typename M::State h = model.embed_forward(w, batch.input_ids, ctx, nullptr);
  for (std::int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
    typename M::BlockCache cache;  // dropped after the layer
    h = mlp_sublayer_forward(model, l, w, model.attention_sublayer_forward(l, w, h, ctx, cache), ctx, cache);
  }
  LmLossCache loss;
  return lm_loss_forward(model.head_spec(), model.head_forward(w, h, ctx, nullptr), batch.targets, ctx, loss,
                         logits_out);
}

}  // namespace atl
