// Gated (GLU-family) activations on raw pointers, templated on T = float or double
// (MODELS.md §0.6, §10.1.10). out[i] = act(g[i], u[i]); computed in T (fp32 for float) from the
// (possibly bf16-rounded) inputs and rounded once to bf16 in precision bf16.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_emulation.hpp"
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

// The bf16 emulation point of precision `p` for T = float or double (bf16_emulation.hpp).
template <class T>
inline T round_emulated(Precision p, T x) {
  return maybe_round_bf16(x, p == Precision::bf16);
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

// act(g, u) for a known activation A, given s = sigmoid(g) and, for situ, tg = tanh(g/βg) and
// tu = tanh(u/βu) (computed per element by glu_rows.cpp's float loops, a row at a time by
// GluRowTerms).
template <GluActivation A, class T>
[[gnu::always_inline]] inline T glu_value_of(T bg, T bu, T g, T u, T s, T tg, T tu) {
  if constexpr (A == GluActivation::swiglu) {
    (void)bg, (void)bu, (void)tg, (void)tu;
    return g * s * u;
  } else {
    return bg * tg * s * (bu * tu);
  }
}

// Partial derivatives of act at (g, u) for a known activation A, given s, tg and tu as above.
template <GluActivation A, class T>
[[gnu::always_inline]] inline void glu_partials_of(T bg, T bu, T g, T u, T s, T tg, T tu, T& d_dg, T& d_du) {
  const T ds = s * (T(1) - s);
  if constexpr (A == GluActivation::swiglu) {
    (void)bg, (void)bu, (void)tg, (void)tu;
    d_dg = u * (s + g * ds);
    d_du = g * s;
  } else {
    const T gate = bg * tg * s;  // capped silu
    const T up = bu * tu;        // capped up
    d_dg = ((T(1) - tg * tg) * s + bg * tg * ds) * up;
    d_du = gate * (T(1) - tu * tu);
  }
}

template <class T>
inline T glu_value_given(const GluConfig& cfg, T g, T u, T s, T tg, T tu) {
  const T bg = static_cast<T>(cfg.beta_gate), bu = static_cast<T>(cfg.beta_up);
  return cfg.activation == GluActivation::swiglu ? glu_value_of<GluActivation::swiglu>(bg, bu, g, u, s, tg, tu)
                                                 : glu_value_of<GluActivation::situ>(bg, bu, g, u, s, tg, tu);
}

template <class T>
inline void glu_partials(const GluConfig& cfg, T g, T u, T s, T tg, T tu, T& d_dg, T& d_du) {
  const T bg = static_cast<T>(cfg.beta_gate), bu = static_cast<T>(cfg.beta_up);
  if (cfg.activation == GluActivation::swiglu) {
    glu_partials_of<GluActivation::swiglu>(bg, bu, g, u, s, tg, tu, d_dg, d_du);
  } else {
    glu_partials_of<GluActivation::situ>(bg, bu, g, u, s, tg, tu, d_dg, d_du);
  }
}

// The transcendental terms of act over n elements (g[i * stride], u[i * stride]), each computed
// over the whole run at once by sigmoid_values and tanh_values (vector_math.hpp): sig =
// sigmoid(g), and for situ tg = tanh(g/βg), tu = tanh(u/βu). The double kernels use it; float
// rows compute the same terms inline (glu_rows.cpp), and tests use it as their reference.
template <class T>
struct GluRowTerms {
  std::vector<T> sig, tg, tu;
  explicit GluRowTerms(std::int64_t n)  // (tg and tu stay 0 for swiglu, which does not read them)
      : sig(static_cast<std::size_t>(n)), tg(sig.size()), tu(sig.size()) {}
  void compute(const GluConfig& cfg, const T* g, const T* u, std::int64_t stride, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) sig[static_cast<std::size_t>(i)] = g[i * stride];
    sigmoid_values(sig.data(), n);
    if (cfg.activation != GluActivation::situ) return;
    const T bg = static_cast<T>(cfg.beta_gate), bu = static_cast<T>(cfg.beta_up);
    for (std::int64_t i = 0; i < n; ++i) {
      tg[static_cast<std::size_t>(i)] = g[i * stride] / bg;
      tu[static_cast<std::size_t>(i)] = u[i * stride] / bu;
    }
    tanh_values(tg.data(), n);
    tanh_values(tu.data(), n);
  }
  T value(const GluConfig& cfg, T g, T u, std::int64_t i) const {
    const auto k = static_cast<std::size_t>(i);
    return glu_value_given(cfg, g, u, sig[k], tg[k], tu[k]);
  }
  void partials(const GluConfig& cfg, T g, T u, std::int64_t i, T& d_dg, T& d_du) const {
    const auto k = static_cast<std::size_t>(i);
    glu_partials(cfg, g, u, sig[k], tg[k], tu[k], d_dg, d_du);
  }
};

// One row of float GLU work, vectorized per instruction set (glu_rows.cpp): g[i * stride] and
// u[i * stride] for i < n, stride 1 or 2. The terms are computed in the same loop by the lane
// functions behind GluRowTerms' loops (lane_math.hpp), then the operations of glu_value_of /
// glu_partials_of: the same bits as GluRowTerms and a scalar loop, without their passes.
//   values:   out[i] = act(g, u), rounded to bf16 when round_bf16
//   partials: dg[i * stride] = d_out[i] * d act/dg, du[i * stride] = d_out[i] * d act/du
void glu_row_values(const GluConfig& cfg, const float* g, const float* u, std::int64_t stride, std::int64_t n,
                    bool round_bf16, float* out);
void glu_row_partials(const GluConfig& cfg, const float* d_out, const float* g, const float* u, std::int64_t stride,
                      std::int64_t n, float* dg, float* du);

// act(g, u) for one element (tests and references).
template <class T>
inline T glu_value(const GluConfig& cfg, T g, T u) {
  GluRowTerms<T> terms(1);
  terms.compute(cfg, &g, &u, 1, 1);
  return terms.value(cfg, g, u, 0);
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
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = gate_up + r * v.row_stride;
      glu_row_values(cfg, row + v.g_offset, row + v.u_offset, v.elem_stride, inter, precision == Precision::bf16,
                     out + r * inter);
    }
  } else {
    GluRowTerms<T> terms(inter);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = gate_up + r * v.row_stride;
      terms.compute(cfg, row + v.g_offset, row + v.u_offset, v.elem_stride, inter);
      for (std::int64_t i = 0; i < inter; ++i) {
        const T g = row[v.g_offset + i * v.elem_stride], u = row[v.u_offset + i * v.elem_stride];
        out[r * inter + i] = terms.value(cfg, g, u, i);
      }
    }
    round_emulated_values(precision, out, rows * inter);
  }
}

// d_gate_up[rows, 2*inter] (overwritten) from d_out[rows, inter]. The output rounding is straight-through.
template <class T>
void glu_backward(const T* d_out, const T* gate_up, std::int64_t rows, std::int64_t inter, const GluConfig& cfg,
                  T* d_gate_up) {
  const GluView v = packed_view(cfg.layout, inter);
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = gate_up + r * v.row_stride;
      T* drow = d_gate_up + r * v.row_stride;
      glu_row_partials(cfg, d_out + r * inter, row + v.g_offset, row + v.u_offset, v.elem_stride, inter,
                       drow + v.g_offset, drow + v.u_offset);
    }
  } else {
    GluRowTerms<T> terms(inter);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = gate_up + r * v.row_stride;
      T* drow = d_gate_up + r * v.row_stride;
      terms.compute(cfg, row + v.g_offset, row + v.u_offset, v.elem_stride, inter);
      for (std::int64_t i = 0; i < inter; ++i) {
        const std::int64_t gi = v.g_offset + i * v.elem_stride, ui = v.u_offset + i * v.elem_stride;
        T d_dg, d_du;
        terms.partials(cfg, row[gi], row[ui], i, d_dg, d_du);
        const T d = d_out[r * inter + i];
        drow[gi] = d * d_dg;
        drow[ui] = d * d_du;
      }
    }
  }
}

// Two-tensor form (dense MLP): gate[n], up[n] -> out[n]; cfg.layout is not used.
template <class T>
void glu_forward_split(const T* gate, const T* up, std::int64_t n, const GluConfig& cfg, Precision precision, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    glu_row_values(cfg, gate, up, 1, n, precision == Precision::bf16, out);
  } else {
    GluRowTerms<T> terms(n);
    terms.compute(cfg, gate, up, 1, n);
    for (std::int64_t i = 0; i < n; ++i) out[i] = terms.value(cfg, gate[i], up[i], i);
    round_emulated_values(precision, out, n);
  }
}

// d_gate[n], d_up[n] (overwritten) from d_out[n].
template <class T>
void glu_backward_split(const T* d_out, const T* gate, const T* up, std::int64_t n, const GluConfig& cfg, T* d_gate,
                        T* d_up) {
  if constexpr (std::is_same_v<T, float>) {
    glu_row_partials(cfg, d_out, gate, up, 1, n, d_gate, d_up);
  } else {
    GluRowTerms<T> terms(n);
    terms.compute(cfg, gate, up, 1, n);
    for (std::int64_t i = 0; i < n; ++i) {
      T d_dg, d_du;
      terms.partials(cfg, gate[i], up[i], i, d_dg, d_du);
      d_gate[i] = d_out[i] * d_dg;
      d_up[i] = d_out[i] * d_du;
    }
  }
}

}  // namespace cpu
}  // namespace atl
