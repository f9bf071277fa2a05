// Finite-difference checks in double precision for CPU kernels (templated on T = double here).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/rng.hpp"
#include "tests/support/worst_of.hpp"

namespace atl::testing {

// Central difference d f / d x[i] for every i; f must not keep references into x.
inline std::vector<double> numeric_gradient(const std::function<double(const std::vector<double>&)>& f,
                                            std::vector<double> x, double step = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double up = f(x);
    x[i] = saved - step;
    const double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * step);
  }
  return g;
}

// max |a - b| / max(1, max |b|): the error relative to the gradient's scale.
inline double scaled_max_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = atl::testing::worst_of(err, std::abs(a[i] - b[i]));
    scale = atl::testing::worst_of(scale, std::abs(b[i]));
  }
  return err / scale;
}

inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0,
                                         const char* name = "test") {
  CounterRng rng(seed, name);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * rng.normal(i);
  return v;
}

// A fixed random weighting of the outputs turns a vector function into the scalar loss
// L = sum_i r_i y_i, whose gradient wrt y is r: the usual way to check a backward pass.
inline double weighted_sum(const std::vector<double>& y, const std::vector<double>& r) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

}  // namespace atl::testing
