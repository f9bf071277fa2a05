#include "kernels/ops/residual_mix.hpp"

#include "kernels/cpu/residual_mix.hpp"
#include "kernels/kernel_clock.hpp"
#include "kernels/ops/op_checks.hpp"

namespace atl {

using detail::require;

namespace {
std::vector<const float*> source_ptrs(const char* op, const std::vector<Tensor>& sources) {
  require(!sources.empty(), op, "needs at least one source");
  std::vector<const float*> out;
  for (std::size_t s = 0; s < sources.size(); ++s) {
    const std::string name = "sources[" + std::to_string(s) + "]";
    detail::require_dtype(op, name.c_str(), sources[s], DType::f32);
    require(sources[s].shape() == sources[0].shape(), op,
            [&] { return name + " " + sources[s].describe() + " must match sources[0] " + sources[0].describe(); });
    out.push_back(sources[s].data<float>());
  }
  require(sources[0].rank() >= 1 && sources[0].size(-1) > 0, op, "sources must be [..., H]");
  return out;
}

void check_query(const char* op, const char* name, const Tensor& q, std::int64_t dim) {
  detail::require_dtype(op, name, q, DType::f32);
  require(q.numel() == dim, op, [&] {
    return std::string(name) + " must hold H = " + std::to_string(dim) + " elements, got " + q.describe();
  });
}
}  // namespace

ResidualMixForward residual_mix_forward(const std::vector<Tensor>& sources, const Tensor& query, float eps,
                                        Precision precision) {
  KernelScope scope(KernelKind::norm);
  constexpr const char* op = "residual_mix_forward";
  std::vector<const float*> ptrs = source_ptrs(op, sources);
  if (sources.size() == 1) return {sources[0], Tensor(), Tensor()};
  const std::int64_t dim = sources[0].size(-1), rows = sources[0].numel() / dim;
  const auto n = static_cast<std::int64_t>(sources.size());
  check_query(op, "query", query, dim);
  ResidualMixForward f{Tensor::empty(sources[0].shape()), Tensor::empty({rows, n}), Tensor::empty({rows, n})};
  cpu::residual_mix_forward<float>(ptrs.data(), n, query.data<float>(), f.out.data<float>(), f.weights.data<float>(),
                                   f.rstd.data<float>(), rows, dim, eps, precision == Precision::bf16);
  return f;
}

std::vector<Tensor> residual_mix_backward(const Tensor& d_out, const std::vector<Tensor>& sources, const Tensor& query,
                                          const ResidualMixForward& saved, const Tensor* dquery) {
  KernelScope scope(KernelKind::norm);
  constexpr const char* op = "residual_mix_backward";
  std::vector<const float*> ptrs = source_ptrs(op, sources);
  detail::require_dtype(op, "d_out", d_out, DType::f32);
  require(d_out.shape() == sources[0].shape(), op,
          [&] { return "d_out " + d_out.describe() + " must match the sources " + sources[0].describe(); });
  if (sources.size() == 1) return {d_out};
  const std::int64_t dim = sources[0].size(-1), rows = sources[0].numel() / dim;
  const auto n = static_cast<std::int64_t>(sources.size());
  check_query(op, "query", query, dim);
  require(saved.weights.defined() && saved.weights.numel() == rows * n && saved.rstd.numel() == rows * n, op, [&] {
    return "saved weights/rstd do not match " + std::to_string(n) + " sources of " + sources[0].describe();
  });
  float* dq = nullptr;
  if (dquery) {
    check_query(op, "dquery", *dquery, dim);
    dq = dquery->data<float>();
  }
  std::vector<Tensor> grads;
  std::vector<float*> gptrs;
  for (std::int64_t s = 0; s < n; ++s) {
    grads.push_back(Tensor::empty(sources[0].shape()));
    gptrs.push_back(grads.back().data<float>());
  }
  cpu::residual_mix_backward<float>(d_out.data<float>(), ptrs.data(), n, query.data<float>(),
                                    saved.weights.data<float>(), saved.rstd.data<float>(), gptrs.data(), dq, rows, dim);
  return grads;
}

}  // namespace atl
