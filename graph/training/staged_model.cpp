#include "graph/training/staged_model.hpp"

#include <stdexcept>
#include <string>

namespace atl {

std::vector<std::vector<std::size_t>> units_per_op(const Plan& plan, const StagedModel& model,
                                                   const std::string& family) {
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(model.op_count()));
  std::vector<int> readers(plan.units.size(), 0);
  for (int op = 0; op < model.op_count(); ++op) {
    for (std::size_t u = 0; u < plan.units.size(); ++u) {
      const UnitPlan& unit = plan.units[u];
      bool mine = false;
      switch (model.op_kind(op)) {
        case OpKind::embedding:
          mine = unit.role == UnitRole::embedding;
          break;
        case OpKind::layer:
          mine = unit.layer == model.op_layer(op);
          break;
        case OpKind::final:
          mine = unit.role == UnitRole::root || unit.role == UnitRole::head ||
                 (unit.role == UnitRole::island && unit.layer < 0);
          break;
      }
      if (mine) {
        out[static_cast<std::size_t>(op)].push_back(u);
        ++readers[u];
      }
    }
  }
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    if (readers[u] != 1) {
      throw std::logic_error("actor runtime: unit '" + plan.units[u].name + "' (" + unit_role_name(plan.units[u].role) +
                             ") is read by " + std::to_string(readers[u]) + " ops of " + family + "; expected exactly 1");
    }
  }
  return out;
}

}  // namespace atl
