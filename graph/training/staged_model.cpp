#include "graph/training/staged_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace atl {

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
    OpSpec attention{name + ".attention", OpKind::attention, layer, {act(layer)}, {mid}, {}};
    std::vector<OpSpec> mlp;
    if (split.sparse && split.sparse(layer)) {
      mlp = {{name + ".router", OpKind::router, layer, {mid}, {x, routing}, {}},
             {name + ".dispatch", OpKind::dispatch, layer, {x, routing}, {"rows." + l}, {}},
             {name + ".experts", OpKind::experts, layer, {"rows." + l}, {"expert_out." + l}, {}},
             {name + ".combine", OpKind::combine, layer, {"expert_out." + l, routing, x, mid}, {act(layer + 1)}, {}}};
    } else {
      mlp = {{name + ".mlp", OpKind::mlp, layer, {mid}, {act(layer + 1)}, {}}};
    }
    const std::size_t prefix = name.size() + 1;  // "<layer>."
    for (const auto& param : groups.layers[static_cast<std::size_t>(layer)]) {
      const std::string rel = param.substr(prefix);
      const bool input = listed(split.mlp_input_norm, rel), output = listed(split.mlp_output_norm, rel);
      if (!input && !output && !starts(rel, "mlp.")) {
        attention.params.push_back(param);
      } else if (mlp.size() == 1) {
        mlp[0].params.push_back(param);
      } else if (input || starts(rel, "mlp.gate.")) {
        mlp[0].params.push_back(param);
      } else if (starts(rel, "mlp.experts.")) {
        mlp[2].params.push_back(param);
      } else {
        mlp[3].params.push_back(param);  // shared experts, output norm
      }
    }
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
    if (!split.sparse || !split.sparse(layer)) continue;
    const std::int64_t K = a.top_k(layer);
    out["x." + l] = {{"x", {T, H}, DType::f32}};
    out["routing." + l] = {{"indices", {T, K}, DType::i32}, {"weights", {T, K}, DType::f32}};
    out["rows." + l] = {{"x_rows", {T * K, H}, DType::f32, true}, {"w_rows", {T * K}, DType::f32, true}};
    out["expert_out." + l] = {{"down_out", {T * K, H}, DType::f32, true}};
  }
  out["logits"] = {{"logits", {T, a.vocab}, DType::f32}};
  out["loss"] = {};
  return out;
}

}  // namespace atl
