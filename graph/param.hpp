// Parameters: what a model declares (ParamSpec) and named tensors that hold values, gradients
// or optimizer moments for those specs (TensorMap, in the model's canonical order).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace atl {

enum class Init { normal, ones, zeros };

struct ParamSpec {
  std::string name;               // HF-style dotted name
  Shape shape;
  DType storage_dtype = DType::f32;  // master copy: fp32 always in atoll
  bool island = false;            // FP32 precision island: computes in fp32 whatever the precision
  Init init = Init::normal;
  bool weight_decay = true;       // matrices decay; vectors (norms, biases, queries) do not

  // The dtype the parameter computes in under a run precision.
  DType compute_dtype(Precision p) const {
    return (island || p == Precision::fp32) ? DType::f32 : DType::bf16;
  }
  std::int64_t numel() const { return shape_numel(shape); }
};

// Named f32 tensors in the order of the specs they were made for.
class TensorMap {
 public:
  TensorMap() = default;
  static TensorMap zeros_like(const std::vector<ParamSpec>& specs);
  // N(0, init_std) from (seed, name, index), ones or zeros as each spec says.
  static TensorMap initialized(const std::vector<ParamSpec>& specs, std::uint64_t seed, float init_std);

  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  void insert(const std::string& name, Tensor t);
  const std::vector<std::string>& names() const { return names_; }
  std::vector<Tensor> tensors() const;
  std::int64_t numel() const;
  TensorMap clone() const;
  void zero() const;

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> tensors_;
  std::map<std::string, std::size_t> index_;
};

// The weights a forward pass reads in a run precision: bulk parameters rounded to bf16 (as an
// FSDP gather in param dtype would deliver them), islands and fp32 runs unchanged.
TensorMap compute_weights(const std::vector<ParamSpec>& specs, const TensorMap& master, Precision precision);

// Elements [first, first + count) (flat, row-major) of parameter `spec` as a fresh model has them:
// ones, zeros, or init_std * normal from the counter RNG keyed by (seed, name) at the element's
// index, so any slice (a rank's shard) is generated without the rest of the tensor.
void fill_initial(const ParamSpec& spec, std::uint64_t seed, float init_std, std::int64_t first, std::int64_t count,
                  float* out);

}  // namespace atl
