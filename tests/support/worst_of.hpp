// The running maximum of an error (or magnitude) where a NaN is the worst value of all:
// std::max(m, NaN) returns m, so a NaN result would read as no error at all.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>

namespace atl::testing {

inline double worst_of(double m, double x) {
  return std::isnan(x) || std::isnan(m) ? std::numeric_limits<double>::infinity() : std::max(m, x);
}

}  // namespace atl::testing
