// The float GLU row loops of activation.hpp, one build per instruction set: with the activation
// and the stride known at compile time the loops vectorize (a runtime stride and a branch per
// element kept them scalar: glu_backward was 4% of a beam-small AMX step). The sigmoid and tanh
// terms are computed in the same loop: before, a pass per term gathered g (or u) into a buffer
// and mapped it, then the loop read the buffers back, and the forward rounded in another pass.
#include <stdexcept>
#include <string>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/isa_dispatch.hpp"
#include "kernels/cpu/lane_math.hpp"

namespace atl::cpu {

namespace {

struct Betas {
  float gate, up;
};

// GluRowTerms' terms for one element: sig = sigmoid(g), and for situ tg = tanh(g/βg), tu = tanh(u/βu).
struct LaneTerms {
  float sig, tg, tu;
};

template <GluActivation A>
[[gnu::always_inline]] inline LaneTerms lane_terms(Betas b, float g, float u) {
  if constexpr (A == GluActivation::situ) {
    return {sigmoid_lane(g), tanh_lane(g / b.gate), tanh_lane(u / b.up)};
  } else {
    return {sigmoid_lane(g), 0.0f, 0.0f};
  }
}

template <GluActivation A, int Stride, bool Round>
struct ValuesLoop {
  [[gnu::always_inline]] void operator()(const float* g, const float* u, Betas b, std::int64_t n,
                                         float* __restrict out) const {
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = g[i * Stride], ui = u[i * Stride];
      const LaneTerms t = lane_terms<A>(b, gi, ui);
      const float v = glu_value_of<A>(b.gate, b.up, gi, ui, t.sig, t.tg, t.tu);
      out[i] = Round ? round_to_bf16(v) : v;
    }
  }
};

template <GluActivation A, int Stride>
struct PartialsLoop {
  [[gnu::always_inline]] void operator()(const float* d_out, const float* g, const float* u, Betas b, std::int64_t n,
                                         float* __restrict dg, float* __restrict du) const {
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = g[i * Stride], ui = u[i * Stride];
      const LaneTerms t = lane_terms<A>(b, gi, ui);
      float d_dg, d_du;
      glu_partials_of<A>(b.gate, b.up, gi, ui, t.sig, t.tg, t.tu, d_dg, d_du);
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

template <GluActivation A, int Stride>
using RoundedValuesLoop = ValuesLoop<A, Stride, true>;
template <GluActivation A, int Stride>
using PlainValuesLoop = ValuesLoop<A, Stride, false>;

}  // namespace

void glu_row_values(const GluConfig& cfg, const float* g, const float* u, std::int64_t stride, std::int64_t n,
                    bool round_bf16, float* out) {
  const Betas b{cfg.beta_gate, cfg.beta_up};
  if (round_bf16) {
    run_row_loop<RoundedValuesLoop>(cfg.activation, stride, g, u, b, n, out);
  } else {
    run_row_loop<PlainValuesLoop>(cfg.activation, stride, g, u, b, n, out);
  }
}

void glu_row_partials(const GluConfig& cfg, const float* d_out, const float* g, const float* u, std::int64_t stride,
                      std::int64_t n, float* dg, float* du) {
  run_row_loop<PartialsLoop>(cfg.activation, stride, d_out, g, u, Betas{cfg.beta_gate, cfg.beta_up}, n, dg, du);
}

}  // namespace atl::cpu
