#include "graph/plan/flat_shards.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace atl {

namespace {

void check_count(const UnitPlan& unit, int count, const char* fn) {
  if (count != unit.shard_count) {
    throw std::invalid_argument(fmt::format("{}: unit '{}' is laid out for {} shards, got a count of {}", fn, unit.name,
                                            unit.shard_count, count));
  }
}

void check_index(const UnitPlan& unit, int index, int count, const char* fn) {
  if (index < 0 || index >= count) {
    throw std::invalid_argument(
        fmt::format("{}: unit '{}': shard index {} is outside [0, {})", fn, unit.name, index, count));
  }
}

const Tensor& full_tensor(const UnitPlan& unit, const UnitParam& p, const TensorMap& map, const char* fn) {
  if (!map.contains(p.name)) {
    throw std::invalid_argument(fmt::format("{}: unit '{}': no tensor for parameter '{}'", fn, unit.name, p.name));
  }
  const Tensor& t = map.at(p.name);
  if (t.dtype() != DType::f32 || t.device() != Device::cpu || t.numel() != p.numel() ||
      (!p.shape.empty() && t.shape() != p.shape)) {
    throw std::invalid_argument(fmt::format("{}: unit '{}': parameter '{}' must be a cpu f32{}, got {}", fn, unit.name,
                                            p.name, shape_string(p.shape), t.describe()));
  }
  return t;
}

// Copies shard `index` of every param into `out` (f32, unit.shard_numel elements, pre-zeroed).
void write_shard(const UnitPlan& unit, const TensorMap& full, int index, float* out, const char* fn) {
  for (const auto& p : unit.params) {
    const float* src = full_tensor(unit, p, full, fn).data<float>();
    const std::int64_t rows = p.rows_on(index);
    std::copy_n(src + p.first_row(index) * p.row_numel, rows * p.row_numel, out + p.shard_offset);
  }
}

template <class T> float widen(T v) {
  if constexpr (std::is_same_v<T, bf16>) return to_float(v);
  else return v;
}

// Writes every param of the gathered buffer into out's tensor of that name (created when absent).
template <class T> void unpack_gathered_as(const UnitPlan& unit, const T* gathered, int count, TensorMap& out) {
  for (const auto& p : unit.params) {
    if (!out.contains(p.name)) out.insert(p.name, Tensor::empty(p.shape));
    const Tensor& t = out.at(p.name);
    float* dst = t.data<float>();
    for (int i = 0; i < count; ++i) {
      const T* src = gathered + static_cast<std::int64_t>(i) * unit.shard_numel + p.shard_offset;
      const std::int64_t n = p.rows_on(i) * p.row_numel;
      float* d = dst + p.first_row(i) * p.row_numel;
      for (std::int64_t k = 0; k < n; ++k) d[k] = widen(src[k]);
    }
  }
}

}  // namespace

Tensor pack_shard(const UnitPlan& unit, const TensorMap& full_params, int shard_index, int shard_count) {
  check_count(unit, shard_count, "pack_shard");
  check_index(unit, shard_index, shard_count, "pack_shard");
  Tensor shard = Tensor::zeros({unit.shard_numel});
  write_shard(unit, full_params, shard_index, shard.data<float>(), "pack_shard");
  return shard;
}

Tensor init_shard(const UnitPlan& unit, const std::vector<ParamSpec>& specs, std::uint64_t seed, float init_std,
                  int shard_index) {
  check_index(unit, shard_index, unit.shard_count, "init_shard");
  Tensor shard = Tensor::zeros({unit.shard_numel});
  for (const UnitParam& p : unit.params) {
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == p.name; });
    if (spec == specs.end()) {
      throw std::invalid_argument(fmt::format("init_shard: unit '{}': no spec for parameter '{}'", unit.name, p.name));
    }
    fill_initial(*spec, seed, init_std, p.first_row(shard_index) * p.row_numel, p.rows_on(shard_index) * p.row_numel,
                 shard.data<float>() + p.shard_offset);
  }
  return shard;
}

namespace {

void unpack_checked(const UnitPlan& unit, const Tensor& gathered, int count, TensorMap& out, const char* fn) {
  check_count(unit, count, fn);
  const std::int64_t expected = static_cast<std::int64_t>(count) * unit.shard_numel;
  if ((gathered.dtype() != DType::f32 && gathered.dtype() != DType::bf16) || gathered.device() != Device::cpu ||
      gathered.numel() != expected) {
    throw std::invalid_argument(fmt::format("{}: unit '{}': expected a cpu f32 or bf16 buffer of {} "
                                            "elements ({} shards of {}), got {}",
                                            fn, unit.name, expected, count, unit.shard_numel, gathered.describe()));
  }
  if (gathered.dtype() == DType::bf16) return unpack_gathered_as(unit, gathered.data<bf16>(), count, out);
  unpack_gathered_as(unit, gathered.data<float>(), count, out);
}

}  // namespace

TensorMap unpack_gathered(const UnitPlan& unit, const Tensor& gathered, int count) {
  TensorMap out;
  unpack_checked(unit, gathered, count, out, "unpack_gathered");
  return out;
}

void unpack_gathered_into(const UnitPlan& unit, const Tensor& gathered, int count, const TensorMap& out) {
  for (const auto& p : unit.params) full_tensor(unit, p, out, "unpack_gathered_into");
  TensorMap view = out;  // shares the tensors
  unpack_checked(unit, gathered, count, view, "unpack_gathered_into");
}

Tensor pack_for_reduce_scatter(const UnitPlan& unit, const TensorMap& full_grads, int count) {
  check_count(unit, count, "pack_for_reduce_scatter");
  Tensor buffer = Tensor::zeros({static_cast<std::int64_t>(count) * unit.shard_numel});
  float* out = buffer.data<float>();
  for (int i = 0; i < count; ++i) {
    write_shard(unit, full_grads, i, out + static_cast<std::int64_t>(i) * unit.shard_numel, "pack_for_reduce_scatter");
  }
  return buffer;
}

TensorMap unpack_shard(const UnitPlan& unit, const Tensor& shard, int shard_index, int count) {
  check_count(unit, count, "unpack_shard");
  check_index(unit, shard_index, count, "unpack_shard");
  if (shard.dtype() != DType::f32 || shard.device() != Device::cpu || shard.numel() != unit.shard_numel) {
    throw std::invalid_argument(fmt::format("unpack_shard: unit '{}': expected a cpu f32 shard of {} elements, got {}",
                                            unit.name, unit.shard_numel, shard.describe()));
  }
  TensorMap out;
  const float* src = shard.data<float>();
  for (const auto& p : unit.params) {
    Shape shape = p.shape.empty() ? Shape{1} : p.shape;
    shape[0] = p.rows_on(shard_index);
    Tensor t = Tensor::empty(shape);
    std::copy_n(src + p.shard_offset, t.numel(), t.data<float>());
    out.insert(p.name, t);
  }
  return out;
}

}  // namespace atl
