#include "graph/checkpoint/config_value.hpp"

#include <cfloat>
#include <cmath>

namespace atl {

bool same_config_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (!a.is_number() || !b.is_number()) return a == b;
  const double x = a.get<double>(), y = b.get<double>();
  if (!a.is_number_float() && !b.is_number_float()) return x == y;  // integers: exactly
  const auto in_float_range = [](double v) { return std::isfinite(v) && std::fabs(v) <= FLT_MAX; };
  return x == y || (in_float_range(x) && in_float_range(y) && static_cast<float>(x) == static_cast<float>(y));
}

}  // namespace atl
