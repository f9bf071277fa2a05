#include "graph/training/staged_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace atl {

namespace {

[[noreturn]] void no_expert_parallelism(const char* what) {
  throw std::logic_error(std::string("micro-batch run: ") + what + ": this model has no expert-parallel experts op");
}

}  // namespace

ExpertRowsOut MicroBatchRun::expert_rows(int) { no_expert_parallelism("expert_rows"); }
void MicroBatchRun::set_expert_output(int, Tensor) { no_expert_parallelism("set_expert_output"); }
Tensor MicroBatchRun::expert_output_grad(int) { no_expert_parallelism("expert_output_grad"); }
void MicroBatchRun::set_expert_input_grads(int, ExpertRowGrads) { no_expert_parallelism("set_expert_input_grads"); }
Tensor MicroBatchRun::expert_group_forward(int, const TensorMap&, std::vector<ExpertSourceRows>) {
  no_expert_parallelism("expert_group_forward");
}
ExpertRowGrads MicroBatchRun::expert_group_backward(int, const TensorMap&, const Tensor&, const std::vector<TensorMap>&) {
  no_expert_parallelism("expert_group_backward");
}

namespace {

// Every parameter in one place: the embedding (the rules' embedding modules), a decoder layer
// (under "<layer_prefix><l>"), or the head (every other: root, head, model-level islands).
struct ParamGroups {
  std::vector<std::string> embed, head;
  std::vector<std::vector<std::string>> layers;
};

ParamGroups group_params(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules, std::int64_t layers) {
  auto under = [](const std::string& name, const std::string& module) {
    return name.size() > module.size() && name.compare(0, module.size(), module) == 0 && name[module.size()] == '.';
  };
  ParamGroups g;
  g.layers.resize(static_cast<std::size_t>(layers));
  for (const auto& s : specs) {
    const bool embedding = std::any_of(rules.embedding_modules.begin(), rules.embedding_modules.end(),
                                       [&](const std::string& m) { return under(s.name, m); });
    if (embedding) {
      g.embed.push_back(s.name);
      continue;
    }
    std::int64_t layer = 0;
    while (layer < layers && !under(s.name, rules.layer_prefix + std::to_string(layer))) ++layer;
    (layer < layers ? g.layers[static_cast<std::size_t>(layer)] : g.head).push_back(s.name);
  }
  return g;
}

}  // namespace

std::vector<OpSpec> sublayer_ops(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules,
                                 std::int64_t layers, const std::string& state, const SublayerSplit& split) {
  auto listed = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  auto starts = [](const std::string& name, const char* prefix) { return name.rfind(prefix, 0) == 0; };
  const ParamGroups groups = group_params(specs, rules, layers);
  auto act = [&](std::int64_t l) { return state + "." + std::to_string(l); };
  std::vector<OpSpec> out;
  out.push_back({"embed", OpKind::embedding, -1, {"input_ids"}, {act(0)}, groups.embed});
  for (std::int64_t layer = 0; layer < layers; ++layer) {
    const std::string name = rules.layer_prefix + std::to_string(layer), l = std::to_string(layer);
    const std::string mid = state + "_mid." + l, x = "x." + l, routing = "routing." + l;
    const bool mixes = !split.attention_mix_prefixes.empty();
    const std::string attn_in = "attn_in." + l;
    OpSpec attention_mix{name + ".attention_mix", OpKind::attention_mix, layer, {act(layer)}, {attn_in}, {}};
    OpSpec attention{name + ".attention", OpKind::attention, layer, {act(layer)}, {mid}, {}};
    if (mixes) attention.inputs.push_back(attn_in);
    std::vector<OpSpec> mlp;
    const bool sparse = split.sparse && split.sparse(layer);
    const bool shared = sparse && split.shared_expert && split.shared_expert(layer);
    if (mixes && !sparse) throw std::logic_error("sublayer_ops: mix ops with a dense layer are not built");
    if (sparse) {
      if (mixes) {
        mlp.push_back({name + ".mlp_mix", OpKind::mlp_mix, layer, {mid}, {x}, {}});
        mlp.push_back({name + ".router", OpKind::router, layer, {x}, {routing}, {}});
      } else {
        mlp.push_back({name + ".router", OpKind::router, layer, {mid}, {x, routing}, {}});
      }
      mlp.push_back({name + ".dispatch", OpKind::dispatch, layer, {x, routing}, {"rows." + l}, {}});
      if (shared) mlp.push_back({name + ".shared_expert", OpKind::shared_expert, layer, {x}, {"shared_out." + l}, {}});
      mlp.push_back({name + ".experts", OpKind::experts, layer, {"rows." + l}, {"expert_out." + l}, {}});
      std::vector<std::string> combined = {"expert_out." + l, routing, x, mid};
      if (shared) combined.push_back("shared_out." + l);
      mlp.push_back({name + ".combine", OpKind::combine, layer, combined, {act(layer + 1)}, {}});
    } else {
      mlp.push_back({name + ".mlp", OpKind::mlp, layer, {mid}, {act(layer + 1)}, {}});
    }
    auto op_of = [&](OpKind kind) -> OpSpec& {
      return *std::find_if(mlp.begin(), mlp.end(), [&](const OpSpec& o) { return o.kind == kind; });
    };
    const std::size_t prefix = name.size() + 1;  // "<layer>."
    for (const auto& param : groups.layers[static_cast<std::size_t>(layer)]) {
      const std::string rel = param.substr(prefix);
      const bool input = listed(split.mlp_input_norm, rel), output = listed(split.mlp_output_norm, rel);
      const bool mix = std::any_of(split.attention_mix_prefixes.begin(), split.attention_mix_prefixes.end(),
                                   [&](const std::string& prefix) { return starts(rel, prefix.c_str()); });
      if (mix) {
        attention_mix.params.push_back(param);
      } else if (!input && !output && !starts(rel, "mlp.")) {
        attention.params.push_back(param);
      } else if (!sparse) {
        mlp.front().params.push_back(param);
      } else if (input && mixes) {
        op_of(OpKind::mlp_mix).params.push_back(param);
      } else if (input || starts(rel, "mlp.gate.")) {
        op_of(OpKind::router).params.push_back(param);
      } else if (starts(rel, "mlp.experts.")) {
        op_of(OpKind::experts).params.push_back(param);
      } else if (starts(rel, "mlp.shared_experts.")) {
        if (!shared) throw std::logic_error("sublayer_ops: " + param + " in a layer the split gives no shared expert");
        op_of(OpKind::shared_expert).params.push_back(param);
      } else {
        op_of(OpKind::combine).params.push_back(param);  // the output norm
      }
    }
    if (mixes) out.push_back(std::move(attention_mix));
    out.push_back(std::move(attention));
    for (auto& m : mlp) out.push_back(std::move(m));
  }
  out.push_back({"head", OpKind::head, -1, {act(layers)}, {"logits"}, groups.head});
  out.push_back({"loss", OpKind::loss, -1, {"logits", "targets"}, {"loss"}, {}});
  return out;
}

std::map<std::string, std::vector<TensorMeta>> sublayer_activation_metas(const ActivationShapes& a,
                                                                         std::int64_t layers, const std::string& state,
                                                                         const SublayerSplit& split, std::int64_t rows,
                                                                         std::int64_t seq) {
  const std::int64_t T = rows * seq, H = a.hidden;
  std::map<std::string, std::vector<TensorMeta>> out;
  out["input_ids"] = {{"input_ids", {rows, seq}, DType::i64}};
  out["targets"] = {{"targets", {rows, seq}, DType::i64}};
  for (std::int64_t layer = 0; layer <= layers; ++layer) {
    const std::string l = std::to_string(layer);
    out[state + "." + l] = a.state(layer, false, T);
    if (layer == layers) break;
    out[state + "_mid." + l] = a.state(layer, true, T);
    if (!split.attention_mix_prefixes.empty()) {
      auto& inputs = out["attn_in." + l];
      for (std::int64_t i = 0; i < a.attention_inputs(layer); ++i) {
        inputs.push_back({"attn_in." + std::to_string(i), {T, H}, DType::f32});
      }
    }
    if (!split.sparse || !split.sparse(layer)) continue;
    const std::int64_t K = a.top_k(layer);
    out["x." + l] = {{"x", {T, H}, DType::f32}};
    out["routing." + l] = {{"indices", {T, K}, DType::i32}, {"weights", {T, K}, DType::f32}};
    out["rows." + l] = {{"x_rows", {T * K, H}, DType::f32, true}, {"w_rows", {T * K}, DType::f32, true}};
    out["expert_out." + l] = {{"down_out", {T * K, H}, DType::f32, true}};
    if (split.shared_expert && split.shared_expert(layer)) out["shared_out." + l] = {{"shared_out", {T, H}, DType::f32}};
  }
  out["logits"] = {{"logits", {T, a.vocab}, DType::f32}};
  out["loss"] = {};
  return out;
}

}  // namespace atl
