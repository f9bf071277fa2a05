#include "graph/training/staged_model.hpp"

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
                                 std::int64_t layers, const std::string& state,
                                 const std::function<bool(const std::string&)>& is_mlp_param) {
  std::vector<OpSpec> out;
  for (OpSpec& op : whole_layer_ops(specs, rules, layers, state)) {
    if (op.kind != OpKind::layer) {
      out.push_back(std::move(op));
      continue;
    }
    const std::string mid = state + "_mid." + std::to_string(op.layer);
    OpSpec attention{op.name + ".attention", OpKind::attention, op.layer, op.inputs, {mid}, {}};
    OpSpec mlp{op.name + ".mlp", OpKind::mlp, op.layer, {mid}, op.outputs, {}};
    const std::size_t prefix = op.name.size() + 1;  // "<layer>."
    for (auto& param : op.params) (is_mlp_param(param.substr(prefix)) ? mlp : attention).params.push_back(param);
    out.push_back(std::move(attention));
    out.push_back(std::move(mlp));
  }
  return out;
}

}  // namespace atl
