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

// An expert-group unit must be told which EP slice it holds; other units hold the only one.
int checked_ep_index(const UnitPlan& unit, int ep_index, const char* fn) {
  if (ep_index < 0 && unit.ep_slices == 1) return 0;
  if (ep_index < 0 || ep_index >= unit.ep_slices) {
    throw std::invalid_argument(fmt::format("{}: unit '{}': EP slice {} is outside [0, {})", fn, unit.name, ep_index,
                                            unit.ep_slices));
  }
  return ep_index;
}

void check_index(const UnitPlan& unit, int index, int count, const char* fn) {
  if (index < 0 || index >= count) {
    throw std::invalid_argument(
        fmt::format("{}: unit '{}': shard index {} is outside [0, {})", fn, unit.name, index, count));
  }
}

// The tensor of param p in `map`, checked: the unit's shape, or with `ep_index` >= 0 the model's
// full tensor of which the unit holds EP slice ep_index (ep_slices contiguous slices on dim 0).
const Tensor& full_tensor(const UnitPlan& unit, const UnitParam& p, const TensorMap& map, const char* fn,
                          int ep_index = -1) {
  if (!map.contains(p.name)) {
    throw std::invalid_argument(fmt::format("{}: unit '{}': no tensor for parameter '{}'", fn, unit.name, p.name));
  }
  const Tensor& t = map.at(p.name);
  Shape shape = p.shape;
  if (ep_index >= 0 && !shape.empty()) shape[0] *= unit.ep_slices;
  const std::int64_t numel = ep_index >= 0 ? p.numel() * unit.ep_slices : p.numel();
  if (t.dtype() != DType::f32 || t.device() != Device::cpu || t.numel() != numel ||
      (!shape.empty() && t.shape() != shape)) {
    throw std::invalid_argument(fmt::format("{}: unit '{}': parameter '{}' must be a cpu f32{}, got {}", fn, unit.name,
                                            p.name, shape_string(shape), t.describe()));
  }
  return t;
}

// Visits the real rows shard `index` owns of param p, one outer block at a time: f(offset of the
// block's first owned element in the param, elements, offset inside the param's shard chunk).
template <class F> void for_owned_rows(const UnitParam& p, int index, F f) {
  const std::int64_t rows = p.rows_on(index), first = p.first_row(index);
  for (std::int64_t o = 0; o < p.outer; ++o) {
    f((o * p.rows + first) * p.row_numel, rows * p.row_numel, o * p.rows_per_rank * p.row_numel);
  }
}

// Copies shard `index` of every param into `out` (f32, unit.shard_numel elements, pre-zeroed).
// ep_index >= 0: `full` holds the model's tensors, the unit EP slice ep_index of them.
void write_shard(const UnitPlan& unit, const TensorMap& full, int index, float* out, const char* fn,
                 int ep_index = -1) {
  for (const auto& p : unit.params) {
    const float* src = full_tensor(unit, p, full, fn, ep_index).data<float>();
    if (ep_index > 0) src += ep_index * p.numel();
    for_owned_rows(p, index, [&](std::int64_t from, std::int64_t n, std::int64_t to) {
      std::copy_n(src + from, n, out + p.shard_offset + to);
    });
  }
}

template <class T> float widen(T v) {
  if constexpr (std::is_same_v<T, bf16>) return to_float(v);
  else return v;
}

// Every param of the gathered buffer, as a full f32 tensor inserted into `out`.
template <class T> void unpack_gathered_as(const UnitPlan& unit, const T* gathered, int count, TensorMap& out) {
  for (const auto& p : unit.params) {
    Tensor t = Tensor::empty(p.shape);
    float* dst = t.data<float>();
    for (int i = 0; i < count; ++i) {
      const T* src = gathered + static_cast<std::int64_t>(i) * unit.shard_numel + p.shard_offset;
      for_owned_rows(p, i, [&](std::int64_t at, std::int64_t n, std::int64_t from) {
        for (std::int64_t k = 0; k < n; ++k) dst[at + k] = widen(src[from + k]);
      });
    }
    out.insert(p.name, std::move(t));
  }
}

}  // namespace

Tensor pack_shard(const UnitPlan& unit, const TensorMap& full_params, int shard_index, int shard_count,
                  int ep_index) {
  check_count(unit, shard_count, "pack_shard");
  check_index(unit, shard_index, shard_count, "pack_shard");
  ep_index = checked_ep_index(unit, ep_index, "pack_shard");
  Tensor shard = Tensor::zeros({unit.shard_numel});
  write_shard(unit, full_params, shard_index, shard.data<float>(), "pack_shard", ep_index);
  return shard;
}

Tensor init_shard(const UnitPlan& unit, const std::vector<ParamSpec>& specs, std::uint64_t seed, float init_std,
                  int shard_index, int ep_index) {
  check_index(unit, shard_index, unit.shard_count, "init_shard");
  ep_index = checked_ep_index(unit, ep_index, "init_shard");
  Tensor shard = Tensor::zeros({unit.shard_numel});
  for (const UnitParam& p : unit.params) {
    const auto spec = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == p.name; });
    if (spec == specs.end()) {
      throw std::invalid_argument(fmt::format("init_shard: unit '{}': no spec for parameter '{}'", unit.name, p.name));
    }
    float* out = shard.data<float>() + p.shard_offset;
    for_owned_rows(p, shard_index, [&](std::int64_t from, std::int64_t n, std::int64_t to) {
      fill_initial(*spec, seed, init_std, ep_index * p.numel() + from, n, out + to);
    });
  }
  return shard;
}

TensorMap unpack_gathered(const UnitPlan& unit, const Tensor& gathered, int count) {
  check_count(unit, count, "unpack_gathered");
  const std::int64_t expected = static_cast<std::int64_t>(count) * unit.shard_numel;
  if ((gathered.dtype() != DType::f32 && gathered.dtype() != DType::bf16) || gathered.device() != Device::cpu ||
      gathered.numel() != expected) {
    throw std::invalid_argument(fmt::format("unpack_gathered: unit '{}': expected a cpu f32 or bf16 buffer of {} "
                                            "elements ({} shards of {}), got {}",
                                            unit.name, expected, count, unit.shard_numel, gathered.describe()));
  }
  TensorMap out;
  if (gathered.dtype() == DType::bf16) {
    unpack_gathered_as(unit, gathered.data<bf16>(), count, out);
  } else {
    unpack_gathered_as(unit, gathered.data<float>(), count, out);
  }
  return out;
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

TensorMap join_ep_slices(const UnitPlan& unit, const std::vector<TensorMap>& slices) {
  if (static_cast<int>(slices.size()) != unit.ep_slices) {
    throw std::invalid_argument(fmt::format("join_ep_slices: unit '{}' has {} EP slices, got {}", unit.name,
                                            unit.ep_slices, slices.size()));
  }
  TensorMap out;
  for (const auto& p : unit.params) {
    Shape shape = p.shape;
    if (!shape.empty()) shape[0] *= unit.ep_slices;
    Tensor t = Tensor::empty(shape);
    for (int e = 0; e < unit.ep_slices; ++e) {
      const Tensor& part = full_tensor(unit, p, slices[static_cast<std::size_t>(e)], "join_ep_slices");
      std::copy_n(part.data<float>(), p.numel(), t.data<float>() + e * p.numel());
    }
    out.insert(p.name, t);
  }
  return out;
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
    shape[static_cast<std::size_t>(p.shard_dim)] = p.rows_on(shard_index);
    Tensor t = Tensor::empty(shape);
    float* dst = t.data<float>();
    for_owned_rows(p, shard_index, [&](std::int64_t, std::int64_t n, std::int64_t from) {
      dst = std::copy_n(src + p.shard_offset + from, n, dst);
    });
    out.insert(p.name, t);
  }
  return out;
}

}  // namespace atl
