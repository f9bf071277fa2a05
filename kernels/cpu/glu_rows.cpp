// The float GLU row loops of activation.hpp, one build per instruction set: with the activation
// and the stride known at compile time the loops vectorize (a runtime stride and a branch per
// element kept them scalar: glu_backward was 4% of a beam-small AMX step).
#include <stdexcept>
#include <string>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/isa_dispatch.hpp"

namespace atl::cpu {

namespace {

struct RowTerms {
  const float *sig, *tg, *tu;
  float beta_gate, beta_up;
};

RowTerms row_terms(const GluConfig& cfg, const GluRowTerms<float>& t) {
  return {t.sig.data(), t.tg.data(), t.tu.data(), cfg.beta_gate, cfg.beta_up};
}

template <GluActivation A, int Stride>
struct ValuesLoop {
  [[gnu::always_inline]] void operator()(const float* g, const float* u, const RowTerms* terms, std::int64_t n,
                                         float* __restrict out) const {
    const RowTerms t = *terms;
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = glu_value_of<A>(t.beta_gate, t.beta_up, g[i * Stride], u[i * Stride], t.sig[i], t.tg[i], t.tu[i]);
    }
  }
};

template <GluActivation A, int Stride>
struct PartialsLoop {
  [[gnu::always_inline]] void operator()(const float* d_out, const float* g, const float* u, const RowTerms* terms,
                                         std::int64_t n, float* __restrict dg, float* __restrict du) const {
    const RowTerms t = *terms;
    for (std::int64_t i = 0; i < n; ++i) {
      float d_dg, d_du;
      glu_partials_of<A>(t.beta_gate, t.beta_up, g[i * Stride], u[i * Stride], t.sig[i], t.tg[i], t.tu[i], d_dg, d_du);
      dg[i * Stride] = d_out[i] * d_dg;
      du[i * Stride] = d_out[i] * d_du;
    }
  }
};

// Loop<activation, stride> for the runtime pair (stride 1: concatenated rows or split tensors;
// 2: interleaved rows).
template <template <GluActivation, int> class Loop, class... Args>
void run_row_loop(GluActivation activation, std::int64_t stride, Args... args) {
  if (stride != 1 && stride != 2) {
    throw std::invalid_argument("glu rows: element stride must be 1 or 2, got " + std::to_string(stride));
  }
  if (activation == GluActivation::swiglu) {
    if (stride == 1) return run_for_isa<Loop<GluActivation::swiglu, 1>>(args...);
    return run_for_isa<Loop<GluActivation::swiglu, 2>>(args...);
  }
  if (stride == 1) return run_for_isa<Loop<GluActivation::situ, 1>>(args...);
  return run_for_isa<Loop<GluActivation::situ, 2>>(args...);
}

}  // namespace

void glu_row_values(const GluConfig& cfg, const float* g, const float* u, std::int64_t stride,
                    const GluRowTerms<float>& terms, std::int64_t n, float* out) {
  const RowTerms t = row_terms(cfg, terms);
  run_row_loop<ValuesLoop>(cfg.activation, stride, g, u, &t, n, out);
}

void glu_row_partials(const GluConfig& cfg, const float* d_out, const float* g, const float* u, std::int64_t stride,
                      const GluRowTerms<float>& terms, std::int64_t n, float* dg, float* du) {
  const RowTerms t = row_terms(cfg, terms);
  run_row_loop<PartialsLoop>(cfg.activation, stride, d_out, g, u, &t, n, dg, du);
}

}  // namespace atl::cpu
