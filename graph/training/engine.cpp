#include "graph/training/engine.hpp"

#include <cmath>

#include <fmt/format.h>

namespace atl {

namespace {
const char* nonfinite_name(double x) { return std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf"; }
}  // namespace

std::string nonfinite_description(double loss, double grad_norm, const std::string& first) {
  std::string what;
  if (!std::isfinite(loss)) what = fmt::format("loss is {}", nonfinite_name(loss));
  if (!std::isfinite(grad_norm)) {
    if (!what.empty()) what += ", ";
    what += fmt::format("gradient norm is {}", nonfinite_name(grad_norm));
    if (!first.empty()) what += " (first non-finite gradient: " + first + ")";
  }
  return what;
}

}  // namespace atl
