#include "graph/models/hf_layout.hpp"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>

namespace atl {

nlohmann::json with_short_floats(nlohmann::json config) {
  if (config.is_structured()) {
    for (auto& item : config) item = with_short_floats(std::move(item));
  } else if (config.is_number_float()) {
    const double wide = config.get<double>();
    if (!std::isfinite(wide) || std::fabs(wide) > FLT_MAX) return config;  // no float
    const auto narrow = static_cast<float>(wide);
    if (static_cast<double>(narrow) == wide) {
      char text[32];
      const auto written = std::to_chars(text, text + sizeof text, narrow);  // shortest round trip
      double shortest = wide;
      std::from_chars(text, written.ptr, shortest);  // locale-free
      config = shortest;
    }
  }
  return config;
}

Tensor transpose_last_two(const Tensor& t) {
  if (t.rank() < 2) throw std::invalid_argument("transpose_last_two: " + t.describe() + " has rank < 2");
  const std::int64_t a = t.size(-2), b = t.size(-1), batch = t.numel() / std::max<std::int64_t>(a * b, 1);
  Shape shape = t.shape();
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  Tensor out = Tensor::empty(shape, t.dtype());
  const std::size_t es = element_size(t.dtype());
  const auto* src = static_cast<const unsigned char*>(t.raw());
  auto* dst = static_cast<unsigned char*>(out.raw());
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t i = 0; i < a; ++i) {
      for (std::int64_t j = 0; j < b; ++j) {
        std::memcpy(dst + ((n * b + j) * a + i) * es, src + ((n * a + i) * b + j) * es, es);
      }
    }
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw std::invalid_argument("stack: no tensors");
  Shape shape = parts[0].shape();
  shape.insert(shape.begin(), static_cast<std::int64_t>(parts.size()));
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  const std::size_t part_bytes = parts[0].bytes();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].shape() != parts[0].shape() || parts[i].dtype() != parts[0].dtype()) {
      throw std::invalid_argument("stack: " + parts[i].describe() + " differs from " + parts[0].describe());
    }
    std::memcpy(static_cast<unsigned char*>(out.raw()) + i * part_bytes, parts[i].raw(), part_bytes);
  }
  return out;
}

std::vector<Tensor> unstack(const Tensor& t) {
  std::vector<Tensor> out;
  Shape inner(t.shape().begin() + 1, t.shape().end());
  for (std::int64_t i = 0; i < t.size(0); ++i) out.push_back(t.slice_rows(i, i + 1).clone().reshape(inner));
  return out;
}

Tensor concat_last(const Tensor& a, const Tensor& b) {
  if (a.rank() != b.rank() || a.dtype() != b.dtype()) {
    throw std::invalid_argument("concat_last: " + a.describe() + " and " + b.describe());
  }
  const std::int64_t ca = a.size(-1), cb = b.size(-1), rows = a.numel() / std::max<std::int64_t>(ca, 1);
  Shape shape = a.shape();
  shape.back() = ca + cb;
  Tensor out = Tensor::empty(shape, a.dtype());
  const std::size_t es = element_size(a.dtype());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<unsigned char*>(out.raw()) + r * (ca + cb) * es,
                static_cast<const unsigned char*>(a.raw()) + r * ca * es, static_cast<std::size_t>(ca) * es);
    std::memcpy(static_cast<unsigned char*>(out.raw()) + (r * (ca + cb) + ca) * es,
                static_cast<const unsigned char*>(b.raw()) + r * cb * es, static_cast<std::size_t>(cb) * es);
  }
  return out;
}

std::pair<Tensor, Tensor> split_last(const Tensor& t, std::int64_t first) {
  const std::int64_t c = t.size(-1), rows = t.numel() / std::max<std::int64_t>(c, 1);
  if (first < 0 || first > c) throw std::invalid_argument("split_last: " + std::to_string(first) + " of " + t.describe());
  Shape sa = t.shape(), sb = t.shape();
  sa.back() = first;
  sb.back() = c - first;
  Tensor a = Tensor::empty(sa, t.dtype()), b = Tensor::empty(sb, t.dtype());
  const std::size_t es = element_size(t.dtype());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<unsigned char*>(a.raw()) + r * first * es,
                static_cast<const unsigned char*>(t.raw()) + r * c * es, static_cast<std::size_t>(first) * es);
    std::memcpy(static_cast<unsigned char*>(b.raw()) + r * (c - first) * es,
                static_cast<const unsigned char*>(t.raw()) + (r * c + first) * es,
                static_cast<std::size_t>(c - first) * es);
  }
  return {a, b};
}

std::string expert_weight_name(const std::string& prefix, std::int64_t expert, const char* weight) {
  return prefix + "." + std::to_string(expert) + "." + weight + ".weight";
}

void per_expert_to_hf(const std::string& prefix, const Tensor& gate_and_up, const Tensor& down, TensorMap& hf) {
  const std::int64_t inter = gate_and_up.size(-1) / 2;
  const auto gu = unstack(gate_and_up), dn = unstack(down);
  for (std::size_t e = 0; e < gu.size(); ++e) {
    auto [gate, up] = split_last(gu[e], inter);  // [H, I] each
    const auto ex = static_cast<std::int64_t>(e);
    hf.insert(expert_weight_name(prefix, ex, "gate_proj"), transpose_last_two(gate));
    hf.insert(expert_weight_name(prefix, ex, "up_proj"), transpose_last_two(up));
    hf.insert(expert_weight_name(prefix, ex, "down_proj"), transpose_last_two(dn[e]));
  }
}

std::pair<Tensor, Tensor> per_expert_from_hf(const std::string& prefix, const Shape& gate_and_up, const TensorMap& hf) {
  if (gate_and_up.size() != 3 || gate_and_up[2] % 2 != 0) {
    throw std::logic_error("per_expert_from_hf: gate_and_up must be [E, H, 2I], got " + shape_string(gate_and_up));
  }
  const std::int64_t experts = gate_and_up[0], h = gate_and_up[1], i = gate_and_up[2] / 2;
  std::vector<Tensor> gu, dn;
  for (std::int64_t e = 0; e < experts; ++e) {
    const Tensor& gate = require_hf_tensor(hf, expert_weight_name(prefix, e, "gate_proj"), {i, h});
    const Tensor& up = require_hf_tensor(hf, expert_weight_name(prefix, e, "up_proj"), {i, h});
    gu.push_back(concat_last(transpose_last_two(gate), transpose_last_two(up)));
    dn.push_back(transpose_last_two(require_hf_tensor(hf, expert_weight_name(prefix, e, "down_proj"), {h, i})));
  }
  return {stack(gu), stack(dn)};
}

namespace {
constexpr const char* kGateUp = "mlp.experts.gate_and_up_projs";
constexpr const char* kDown = "mlp.experts.down_projs";

std::string without_tail(const std::string& s, const std::string& tail) { return s.substr(0, s.size() - tail.size()); }
std::string experts_prefix(const std::string& native_gate_up) { return without_tail(native_gate_up, kGateUp) + "mlp.experts"; }
}  // namespace

TensorMap per_expert_layout_to_hf(const std::vector<ParamSpec>& specs, const TensorMap& native, HfName hf_name) {
  TensorMap hf;
  for (const auto& s : specs) {
    if (s.name.ends_with(kDown)) continue;  // written together with its gate_and_up
    if (s.name.ends_with(kGateUp)) {
      per_expert_to_hf(experts_prefix(s.name), native.at(s.name), native.at(without_tail(s.name, kGateUp) + kDown), hf);
    } else {
      hf.insert(hf_name(s.name), native.at(s.name));
    }
  }
  return hf;
}

TensorMap per_expert_layout_from_hf(const std::vector<ParamSpec>& specs, const TensorMap& hf, HfName hf_name,
                                    const std::string& family) {
  TensorMap native;
  std::set<std::string> used;
  Tensor pending_down;
  for (const auto& s : specs) {
    if (s.name.ends_with(kGateUp)) {
      const std::string prefix = experts_prefix(s.name);
      auto [gate_up, down] = per_expert_from_hf(prefix, s.shape, hf);
      for (std::int64_t e = 0; e < s.shape[0]; ++e) {
        for (const char* w : {"gate_proj", "up_proj", "down_proj"}) used.insert(expert_weight_name(prefix, e, w));
      }
      native.insert(s.name, gate_up);
      pending_down = down;
    } else if (s.name.ends_with(kDown)) {
      native.insert(s.name, pending_down);
    } else {
      const std::string name = hf_name(s.name);
      native.insert(s.name, require_hf_tensor(hf, name, s.shape));
      used.insert(name);
    }
  }
  for (const auto& name : hf.names()) {
    if (!used.count(name)) throw std::invalid_argument("HF state dict: unexpected tensor '" + name + "' for " + family);
  }
  return native;
}

const Tensor& require_hf_tensor(const TensorMap& hf, const std::string& name, const Shape& shape) {
  if (!hf.contains(name)) throw std::invalid_argument("HF state dict: missing tensor '" + name + "'");
  const Tensor& t = hf.at(name);
  if (t.shape() != shape) {
    throw std::invalid_argument("HF state dict: tensor '" + name + "' is " + t.describe() + ", expected shape " +
                                shape_string(shape));
  }
  return t;
}

}  // namespace atl
