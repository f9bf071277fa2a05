#include "kernels/ops/activation.hpp"
#include "kernels/kernel_clock.hpp"

#include <stdexcept>
#include <string>

namespace atl {

namespace {

void check_f32_cpu(const char* op, const char* name, const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::f32 || t.device() != Device::cpu || t.rank() < 1) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must be a defined f32 cpu tensor of rank >= 1, got " +
                                t.describe());
  }
}

void check_same_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  if (t.shape() != expected) {
    throw std::invalid_argument(std::string(op) + ": " + name + " must have shape " + shape_string(expected) +
                                ", got " + t.describe());
  }
}

// gate_up [..., 2I] -> the shape [..., I].
Shape halved_shape(const char* op, const Tensor& gate_up) {
  Shape s = gate_up.shape();
  if (s.back() % 2 != 0) {
    throw std::invalid_argument(std::string(op) + ": gate_up last dim must be even (2I), got " + gate_up.describe());
  }
  s.back() /= 2;
  return s;
}

}  // namespace

Tensor glu_forward(const Tensor& gate_up, const GluConfig& cfg, Precision precision) {
  KernelScope scope(KernelKind::activation);
  check_f32_cpu("glu_forward", "gate_up", gate_up);
  Shape out_shape = halved_shape("glu_forward", gate_up);
  const std::int64_t inter = out_shape.back();
  const std::int64_t rows = inter == 0 ? 0 : shape_numel(out_shape) / inter;
  Tensor out = Tensor::empty(out_shape);
  cpu::glu_forward(gate_up.data<float>(), rows, inter, cfg, precision, out.data<float>());
  return out;
}

Tensor glu_backward(const Tensor& d_out, const Tensor& gate_up, const GluConfig& cfg) {
  KernelScope scope(KernelKind::activation);
  check_f32_cpu("glu_backward", "gate_up", gate_up);
  check_f32_cpu("glu_backward", "d_out", d_out);
  Shape out_shape = halved_shape("glu_backward", gate_up);
  check_same_shape("glu_backward", "d_out", d_out, out_shape);
  const std::int64_t inter = out_shape.back();
  const std::int64_t rows = inter == 0 ? 0 : shape_numel(out_shape) / inter;
  Tensor d_gate_up = Tensor::empty(gate_up.shape());
  cpu::glu_backward(d_out.data<float>(), gate_up.data<float>(), rows, inter, cfg, d_gate_up.data<float>());
  return d_gate_up;
}

Tensor glu_forward(const Tensor& gate, const Tensor& up, const GluConfig& cfg, Precision precision) {
  KernelScope scope(KernelKind::activation);
  check_f32_cpu("glu_forward", "gate", gate);
  check_f32_cpu("glu_forward", "up", up);
  check_same_shape("glu_forward", "up", up, gate.shape());
  Tensor out = Tensor::empty(gate.shape());
  cpu::glu_forward_split(gate.data<float>(), up.data<float>(), gate.numel(), cfg, precision, out.data<float>());
  return out;
}

GluSplitGrads glu_backward(const Tensor& d_out, const Tensor& gate, const Tensor& up, const GluConfig& cfg) {
  KernelScope scope(KernelKind::activation);
  check_f32_cpu("glu_backward", "gate", gate);
  check_f32_cpu("glu_backward", "up", up);
  check_f32_cpu("glu_backward", "d_out", d_out);
  check_same_shape("glu_backward", "up", up, gate.shape());
  check_same_shape("glu_backward", "d_out", d_out, gate.shape());
  GluSplitGrads grads{Tensor::empty(gate.shape()), Tensor::empty(gate.shape())};
  cpu::glu_backward_split(d_out.data<float>(), gate.data<float>(), up.data<float>(), gate.numel(), cfg,
                          grads.d_gate.data<float>(), grads.d_up.data<float>());
  return grads;
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Precision precision) {
  KernelScope scope(KernelKind::activation);
  return glu_forward(gate, up, GluConfig{}, precision);
}

GluSplitGrads swiglu_backward(const Tensor& d_out, const Tensor& gate, const Tensor& up) {
  KernelScope scope(KernelKind::activation);
  return glu_backward(d_out, gate, up, GluConfig{});
}

}  // namespace atl
