#include "kernels/ops/gate.hpp"

#include <stdexcept>
#include <string>

#include "kernels/cpu/gate.hpp"
#include "kernels/kernel_clock.hpp"

namespace atl {

namespace {

struct GateLayout {
  std::int64_t rows = 0, heads = 0, head_dim = 0;
};


bool is_cpu_f32(const Tensor& t) { return t.defined() && t.dtype() == DType::f32 && t.device() == Device::cpu; }

GateLayout check_inputs(const char* op, const Tensor& o, const Tensor& gate, const Tensor& bias) {
  const std::string where = std::string(op) + ": ";
  if (!is_cpu_f32(bias) || bias.rank() != 1 || bias.size(0) == 0) {
    throw std::invalid_argument(where + "bias must be a cpu f32 tensor [Hq], got " + bias.describe());
  }
  GateLayout l;
  l.heads = bias.size(0);
  if (!is_cpu_f32(o) || o.rank() < 1 || o.size(-1) % l.heads != 0) {
    throw std::invalid_argument(where + "o must be a cpu f32 tensor [..., Hq*D] with Hq = " +
                                std::to_string(l.heads) + ", got " + o.describe());
  }
  if (!is_cpu_f32(gate) || gate.shape() != o.shape()) {
    throw std::invalid_argument(where + "gate must be a cpu f32 tensor " + shape_string(o.shape()) + ", got " +
                                gate.describe());
  }
  l.head_dim = o.size(-1) / l.heads;
  l.rows = l.head_dim == 0 ? 0 : o.numel() / (l.heads * l.head_dim);
  return l;
}

}  // namespace

Tensor output_gate_forward(const Tensor& o, const Tensor& gate, const Tensor& bias) {
  KernelScope scope(KernelKind::activation);
  const GateLayout l = check_inputs("output_gate_forward", o, gate, bias);
  Tensor y = Tensor::empty(o.shape(), DType::f32);
  cpu::output_gate_forward<float>(o.data<float>(), gate.data<float>(), bias.data<float>(), y.data<float>(), l.rows,
                                  l.heads, l.head_dim);
  return y;
}

OutputGateGrads output_gate_backward(const Tensor& dy, const Tensor& o, const Tensor& gate, const Tensor& bias,
                                     Tensor* d_bias) {
  KernelScope scope(KernelKind::activation);
  const char* op = "output_gate_backward";
  const GateLayout l = check_inputs(op, o, gate, bias);
  if (!is_cpu_f32(dy) || dy.shape() != o.shape()) {
    throw std::invalid_argument(std::string(op) + ": dy must be a cpu f32 tensor " + shape_string(o.shape()) +
                                ", got " + dy.describe());
  }
  if (d_bias != nullptr && (!is_cpu_f32(*d_bias) || d_bias->shape() != bias.shape())) {
    throw std::invalid_argument(std::string(op) + ": d_bias must be a cpu f32 tensor " +
                                shape_string(bias.shape()) + ", got " + d_bias->describe());
  }
  OutputGateGrads g;
  g.d_o = Tensor::empty(o.shape(), DType::f32);
  g.d_gate = Tensor::empty(o.shape(), DType::f32);
  cpu::output_gate_backward<float>(dy.data<float>(), o.data<float>(), gate.data<float>(), bias.data<float>(),
                                   g.d_o.data<float>(), g.d_gate.data<float>(),
                                   d_bias != nullptr ? d_bias->data<float>() : nullptr, l.rows, l.heads, l.head_dim);
  return g;
}

}  // namespace atl
