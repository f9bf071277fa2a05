#include "graph/plan/op_graph.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace atl {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::embedding: return "embedding";
    case OpKind::attention_mix: return "attention_mix";
    case OpKind::attention: return "attention";
    case OpKind::mlp_mix: return "mlp_mix";
    case OpKind::mlp: return "mlp";
    case OpKind::router: return "router";
    case OpKind::dispatch: return "dispatch";
    case OpKind::shared_expert: return "shared_expert";
    case OpKind::experts: return "experts";
    case OpKind::combine: return "combine";
    case OpKind::head: return "head";
    case OpKind::loss: return "loss";
  }
  return "?";
}

std::vector<std::vector<std::size_t>> units_per_op(const Plan& plan, const std::vector<OpSpec>& ops) {
  std::map<std::string, std::size_t> unit_of;
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    for (const auto& p : plan.units[u].params) unit_of[p.name] = u;
  }
  std::vector<std::vector<std::size_t>> out;
  std::vector<int> readers(plan.units.size(), 0);
  for (const OpSpec& op : ops) {
    std::vector<bool> reads(plan.units.size(), false);
    for (const auto& param : op.params) {
      const auto it = unit_of.find(param);
      if (it == unit_of.end()) {
        throw std::logic_error("op graph: op '" + op.name + "' reads parameter '" + param +
                               "' that no unit of the plan owns");
      }
      reads[it->second] = true;
    }
    auto& units = out.emplace_back();
    for (std::size_t u = 0; u < reads.size(); ++u) {
      if (!reads[u]) continue;
      units.push_back(u);
      ++readers[u];
    }
  }
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    if (readers[u] == 0) {
      throw std::logic_error("op graph: unit '" + plan.units[u].name + "' (" + unit_role_name(plan.units[u].role) +
                             ") is read by no op");
    }
  }
  return out;
}

std::string format_activations(const std::vector<OpSpec>& ops,
                               const std::map<std::string, std::vector<TensorMeta>>& metas) {
  std::vector<std::string> order;
  for (const OpSpec& op : ops) {
    for (const auto* list : {&op.inputs, &op.outputs}) {
      for (const std::string& a : *list) {
        if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
      }
    }
  }
  std::string out;
  for (const std::string& a : order) {
    const auto it = metas.find(a);
    if (it == metas.end()) throw std::logic_error("format_activations: no metas for activation '" + a + "'");
    std::vector<std::string> tensors;
    std::int64_t bytes = 0;
    for (const TensorMeta& t : it->second) {
      tensors.push_back(t.describe());
      bytes += t.bytes();
    }
    out += fmt::format("  {:<14} {} ({} bytes{})\n", a, tensors.empty() ? "(no tensors)" : fmt::format("{}", fmt::join(tensors, ", ")),
                       bytes, std::any_of(it->second.begin(), it->second.end(), [](const TensorMeta& t) { return t.upper_bound; })
                                  ? " at most"
                                  : "");
  }
  return out;
}

}  // namespace atl
