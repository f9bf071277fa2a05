// Gated (GLU-family) activations on raw pointers, templated on T = float or double
// (MODELS.md §0.6, §10.1.10). out[i] = act(g[i], u[i]); computed in T (fp32 for float) from the
// (possibly bf16-rounded) inputs and rounded once to bf16 in precision bf16.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/vector_math.hpp"
#include "kernels/dtype.hpp"
#include "kernels/precision.hpp"

namespace atl {

enum class GluActivation {
  swiglu,  // silu(g) * u
  situ,    // βg·tanh(g/βg)·sigmoid(g) · βu·tanh(u/βu); the sigmoid sees the raw gate
};

// Where gate and up live inside one [.., 2I] row.
enum class GluLayout {
  concatenated,  // [g0..g_{I-1} | u0..u_{I-1}]
  interleaved,   // g0,u0,g1,u1,...
};

struct GluConfig {
  GluActivation activation = GluActivation::swiglu;
  GluLayout layout = GluLayout::concatenated;
  float beta_gate = 4.0f;  // situ only (Kimi-K3 defaults)
  float beta_up = 25.0f;
};

namespace cpu {

// The bf16 emulation point for T = float or double (double rounds through float, so a double
// run in precision bf16 sees the same grid; gradient checks use precision fp32).
template <class T>
inline T round_emulated(Precision p, T x) {
  if (p != Precision::bf16) return x;
  return static_cast<T>(round_to_bf16(static_cast<float>(x)));
}

// round_emulated over n values (vectorized for float).
template <class T>
inline void round_emulated_values(Precision p, T* x, std::int64_t n) {
  if (p != Precision::bf16) return;
  if constexpr (std::is_same_v<T, float>) {
    round_to_bf16_values(x, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) x[i] = round_emulated(p, x[i]);
  }
}

// act(g, u) given s = sigmoid(g) (computed a row at a time by sigmoid_values, vector_math.hpp).
template <class T>
inline T glu_value_given(const GluConfig& cfg, T g, T u, T s) {
  if (cfg.activation == GluActivation::swiglu) return g * s * u;
  const T bg = static_cast<T>(cfg.beta_gate), bu = static_cast<T>(cfg.beta_up);
  return bg * tanh_value(g / bg) * s * (bu * tanh_value(u / bu));
}

template <class T>
inline T glu_value(const GluConfig& cfg, T g, T u) {
  T s = g;
  sigmoid_values(&s, 1);
  return glu_value_given(cfg, g, u, s);
}

// Partial derivatives of glu_value at (g, u), given s = sigmoid(g).
template <class T>
inline void glu_partials(const GluConfig& cfg, T g, T u, T s, T& d_dg, T& d_du) {
  const T ds = s * (T(1) - s);
  if (cfg.activation == GluActivation::swiglu) {
    d_dg = u * (s + g * ds);
    d_du = g * s;
    return;
  }
  const T bg = static_cast<T>(cfg.beta_gate), bu = static_cast<T>(cfg.beta_up);
  const T tg = tanh_value(g / bg), tu = tanh_value(u / bu);
  const T gate = bg * tg * s;  // capped silu
  const T up = bu * tu;        // capped up
  d_dg = ((T(1) - tg * tg) * s + bg * tg * ds) * up;
  d_du = gate * (T(1) - tu * tu);
}

// sig[i] = sigmoid(g[i * stride]) for i < n.
template <class T>
inline void gate_sigmoids(const T* g, std::int64_t stride, std::int64_t n, T* sig) {
  for (std::int64_t i = 0; i < n; ++i) sig[i] = g[i * stride];
  sigmoid_values(sig, n);
}

// Addressing of g and u: element i of row r is at base[r*row_stride + i*elem_stride].
struct GluView {
  std::int64_t g_offset, u_offset, row_stride, elem_stride;
};

inline GluView packed_view(GluLayout layout, std::int64_t inter) {
  if (layout == GluLayout::concatenated) return {0, inter, 2 * inter, 1};
  return {0, 1, 2 * inter, 2};
}

// out[rows, inter] from gate_up[rows, 2*inter] in the given layout.
template <class T>
void glu_forward(const T* gate_up, std::int64_t rows, std::int64_t inter, const GluConfig& cfg, Precision precision,
                 T* out) {
  const GluView v = packed_view(cfg.layout, inter);
  std::vector<T> sig(static_cast<std::size_t>(inter));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = gate_up + r * v.row_stride;
    gate_sigmoids(row + v.g_offset, v.elem_stride, inter, sig.data());
    for (std::int64_t i = 0; i < inter; ++i) {
      const T g = row[v.g_offset + i * v.elem_stride], u = row[v.u_offset + i * v.elem_stride];
      out[r * inter + i] = glu_value_given(cfg, g, u, sig[static_cast<std::size_t>(i)]);
    }
  }
  round_emulated_values(precision, out, rows * inter);
}

// d_gate_up[rows, 2*inter] (overwritten) from d_out[rows, inter]. The output rounding is straight-through.
template <class T>
void glu_backward(const T* d_out, const T* gate_up, std::int64_t rows, std::int64_t inter, const GluConfig& cfg,
                  T* d_gate_up) {
  const GluView v = packed_view(cfg.layout, inter);
  std::vector<T> sig(static_cast<std::size_t>(inter));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = gate_up + r * v.row_stride;
    T* drow = d_gate_up + r * v.row_stride;
    gate_sigmoids(row + v.g_offset, v.elem_stride, inter, sig.data());
    for (std::int64_t i = 0; i < inter; ++i) {
      const std::int64_t gi = v.g_offset + i * v.elem_stride, ui = v.u_offset + i * v.elem_stride;
      T d_dg, d_du;
      glu_partials(cfg, row[gi], row[ui], sig[static_cast<std::size_t>(i)], d_dg, d_du);
      const T d = d_out[r * inter + i];
      drow[gi] = d * d_dg;
      drow[ui] = d * d_du;
    }
  }
}

// Two-tensor form (dense MLP): gate[n], up[n] -> out[n]; cfg.layout is not used.
template <class T>
void glu_forward_split(const T* gate, const T* up, std::int64_t n, const GluConfig& cfg, Precision precision, T* out) {
  std::vector<T> sig(static_cast<std::size_t>(n));
  gate_sigmoids(gate, 1, n, sig.data());
  for (std::int64_t i = 0; i < n; ++i) out[i] = glu_value_given(cfg, gate[i], up[i], sig[static_cast<std::size_t>(i)]);
  round_emulated_values(precision, out, n);
}

// d_gate[n], d_up[n] (overwritten) from d_out[n].
template <class T>
void glu_backward_split(const T* d_out, const T* gate, const T* up, std::int64_t n, const GluConfig& cfg, T* d_gate,
                        T* d_up) {
  std::vector<T> sig(static_cast<std::size_t>(n));
  gate_sigmoids(gate, 1, n, sig.data());
  for (std::int64_t i = 0; i < n; ++i) {
    T d_dg, d_du;
    glu_partials(cfg, gate[i], up[i], sig[static_cast<std::size_t>(i)], d_dg, d_du);
    d_gate[i] = d_out[i] * d_dg;
    d_up[i] = d_out[i] * d_du;
  }
}

}  // namespace cpu
}  // namespace atl
