#include "graph/training/staged_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace atl {

std::vector<OpSpec> whole_layer_ops(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules,
                                    std::int64_t layers, const std::string& state) {
  auto under = [](const std::string& name, const std::string& module) {
    return name.size() > module.size() && name.compare(0, module.size(), module) == 0 && name[module.size()] == '.';
  };
  auto act = [&](std::int64_t l) { return state + "." + std::to_string(l); };
  std::vector<OpSpec> ops;
  OpSpec embed{"embed", OpKind::embedding, -1, {"input_ids"}, {act(0)}, {}};
  std::vector<OpSpec> layer_ops;
  for (std::int64_t l = 0; l < layers; ++l) {
    layer_ops.push_back({rules.layer_prefix + std::to_string(l), OpKind::layer, l, {act(l)}, {act(l + 1)}, {}});
  }
  OpSpec head{"head", OpKind::final, -1, {act(layers), "targets"}, {"loss"}, {}};
  for (const auto& s : specs) {
    bool placed = false;
    for (const auto& m : rules.embedding_modules) {
      if (!placed && under(s.name, m)) {
        embed.params.push_back(s.name);
        placed = true;
      }
    }
    for (std::int64_t l = 0; l < layers && !placed; ++l) {
      if (under(s.name, rules.layer_prefix + std::to_string(l))) {
        layer_ops[static_cast<std::size_t>(l)].params.push_back(s.name);
        placed = true;
      }
    }
    if (!placed) head.params.push_back(s.name);
  }
  ops.push_back(std::move(embed));
  for (auto& op : layer_ops) ops.push_back(std::move(op));
  ops.push_back(std::move(head));
  return ops;
}

std::vector<OpSpec> sublayer_ops(const std::vector<ParamSpec>& specs, const FamilyShardingRules& rules,
                                 std::int64_t layers, const std::string& state, const SublayerSplit& split) {
  auto listed = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  auto starts = [](const std::string& name, const char* prefix) { return name.rfind(prefix, 0) == 0; };
  std::vector<OpSpec> out;
  for (OpSpec& op : whole_layer_ops(specs, rules, layers, state)) {
    if (op.kind != OpKind::layer) {
      out.push_back(std::move(op));
      continue;
    }
    const std::string l = std::to_string(op.layer);
    const std::string mid = state + "_mid." + l, x = "x." + l, routing = "routing." + l;
    OpSpec attention{op.name + ".attention", OpKind::attention, op.layer, op.inputs, {mid}, {}};
    std::vector<OpSpec> mlp;
    if (split.sparse && split.sparse(op.layer)) {
      mlp = {{op.name + ".router", OpKind::router, op.layer, {mid}, {x, routing}, {}},
             {op.name + ".dispatch", OpKind::dispatch, op.layer, {x, routing}, {"rows." + l}, {}},
             {op.name + ".experts", OpKind::experts, op.layer, {"rows." + l}, {"expert_out." + l}, {}},
             {op.name + ".combine", OpKind::combine, op.layer, {"expert_out." + l, routing, x, mid}, op.outputs, {}}};
    } else {
      mlp = {{op.name + ".mlp", OpKind::mlp, op.layer, {mid}, op.outputs, {}}};
    }
    const std::size_t prefix = op.name.size() + 1;  // "<layer>."
    for (auto& param : op.params) {
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
  return out;
}

}  // namespace atl
