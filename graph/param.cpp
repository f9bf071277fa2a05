#include "graph/param.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/rng.hpp"

namespace atl {

TensorMap TensorMap::zeros_like(const std::vector<ParamSpec>& specs) {
  TensorMap m;
  for (const auto& s : specs) m.insert(s.name, Tensor::zeros(s.shape));
  return m;
}

void fill_initial(const ParamSpec& spec, std::uint64_t seed, float init_std, std::int64_t first, std::int64_t count,
                  float* out) {
  switch (spec.init) {
    case Init::ones: std::fill(out, out + count, 1.0f); return;
    case Init::zeros: std::fill(out, out + count, 0.0f); return;
    case Init::normal: {
      CounterRng rng(seed, spec.name);
      for (std::int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<float>(init_std * rng.normal(static_cast<std::uint64_t>(first + i)));
      }
      return;
    }
  }
}

TensorMap TensorMap::initialized(const std::vector<ParamSpec>& specs, std::uint64_t seed, float init_std) {
  TensorMap m;
  for (const auto& s : specs) {
    Tensor t = Tensor::empty(s.shape);
    fill_initial(s, seed, init_std, 0, t.numel(), t.data<float>());
    m.insert(s.name, t);
  }
  return m;
}

const Tensor& TensorMap::at(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::out_of_range("no parameter named '" + name + "'");
  return tensors_[it->second];
}

void TensorMap::insert(const std::string& name, Tensor t) {
  if (index_.count(name)) throw std::logic_error("parameter '" + name + "' declared twice");
  index_[name] = tensors_.size();
  names_.push_back(name);
  tensors_.push_back(std::move(t));
}

std::vector<Tensor> TensorMap::tensors() const { return tensors_; }

std::int64_t TensorMap::numel() const {
  std::int64_t n = 0;
  for (const auto& t : tensors_) n += t.numel();
  return n;
}

TensorMap TensorMap::clone() const {
  TensorMap m;
  for (std::size_t i = 0; i < names_.size(); ++i) m.insert(names_[i], tensors_[i].clone());
  return m;
}

void TensorMap::zero() const {
  for (const auto& t : tensors_) t.fill(0.0f);
}

TensorMap compute_weights(const std::vector<ParamSpec>& specs, const TensorMap& master, Precision precision) {
  TensorMap m;
  for (const auto& s : specs) {
    const Tensor& t = master.at(s.name);
    m.insert(s.name, s.compute_dtype(precision) == DType::bf16 ? bf16_rounded(t) : t);
  }
  return m;
}

}  // namespace atl
