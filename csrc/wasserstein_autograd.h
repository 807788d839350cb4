// Autograd of entangle_ext::wasserstein2_1d, in C++ (registered for the Autograd key by
// csrc/registration.cpp). A Python torch.library.register_autograd costs about 40 us per
// forward+backward, which is most of a small call; this costs a few. The fake (meta) kernels stay
// in Python (entangle_ext/wasserstein.py).
//
// Forward: the kernels return dW2^2_s/dx for every input that requires grad (the flags are raised
// here when autograd needs them), so the backward is one elementwise product, done by
// wasserstein2_1d_backward. du/dv are differentiable outputs whose gradient is ignored: with
// create_graph=True the backward's result then depends on them, and a double backward reaches
// the backward op's own autograd, which raises NotImplementedError.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

namespace entangle_ext {
namespace w2 {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> call_forward(
    const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo, const at::Tensor& vo,
    int64_t max_seqlen, bool grad_u, bool grad_v, bool validate) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("entangle_ext::wasserstein2_1d", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, int64_t, bool, bool, bool)>();
  return op.call(u, v, uo, vo, max_seqlen, grad_u, grad_v, validate);
}

inline std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad, const at::Tensor& du,
                                                        const at::Tensor& dv, const at::Tensor& uo,
                                                        const at::Tensor& vo) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("entangle_ext::wasserstein2_1d_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, du, dv, uo, vo);
}

struct W2Function : public torch::autograd::Function<W2Function> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u, const at::Tensor& v,
                               const at::Tensor& uo, const at::Tensor& vo, int64_t max_seqlen,
                               bool grad_u, bool grad_v, bool validate) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [w2, du, dv] = call_forward(u, v, uo, vo, max_seqlen, grad_u, grad_v, validate);
    ctx->save_for_backward({du, dv, uo, vo});
    return {w2, du, dv};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [gu, gv] = call_backward(grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3]);
    return {ctx->needs_input_grad(0) ? gu : at::Tensor(), ctx->needs_input_grad(1) ? gv : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct W2BackwardFunction : public torch::autograd::Function<W2BackwardFunction> {
  static variable_list forward(AutogradContext*, const at::Tensor& grad, const at::Tensor& du,
                               const at::Tensor& dv, const at::Tensor& uo, const at::Tensor& vo) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [gu, gv] = call_backward(grad, du, dv, uo, vo);
    return {gu, gv};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "entangle_ext.wasserstein2_1d: double backward (second "
                                       "derivatives of W2^2) is not implemented");
  }
};

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> w2_autograd(
    const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo, const at::Tensor& vo,
    int64_t max_seqlen, bool grad_u, bool grad_v, bool validate) {
  const bool need_u = at::GradMode::is_enabled() && u.requires_grad();
  const bool need_v = at::GradMode::is_enabled() && v.requires_grad();
  if (!need_u && !need_v) {  // nothing to record
    at::AutoDispatchBelowADInplaceOrView below;
    return call_forward(u, v, uo, vo, max_seqlen, grad_u, grad_v, validate);
  }
  auto out = W2Function::apply(u, v, uo, vo, max_seqlen, grad_u || need_u, grad_v || need_v, validate);
  return {out[0], out[1], out[2]};
}

inline std::tuple<at::Tensor, at::Tensor> w2_backward_autograd(const at::Tensor& grad,
                                                               const at::Tensor& du,
                                                               const at::Tensor& dv,
                                                               const at::Tensor& uo,
                                                               const at::Tensor& vo) {
  if (!at::GradMode::is_enabled()) {  // the usual backward (no create_graph): nothing to record
    at::AutoDispatchBelowADInplaceOrView below;
    return call_backward(grad, du, dv, uo, vo);
  }
  auto out = W2BackwardFunction::apply(grad, du, dv, uo, vo);
  return {out[0], out[1]};
}

}  // namespace w2
}  // namespace entangle_ext
