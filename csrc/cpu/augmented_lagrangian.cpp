// CPU kernels of the augmented-Lagrangian operators (Stage 1, docs/algorithm.md §2 and §6):
//   dual_update_                  lam <- clip(proj((1 - damping) lam + mu g))   (in place)
//   augmented_lagrangian          sum_i term(g_i, lam_i, mu_i)                   -> ()
//   augmented_lagrangian_backward grad * d term / d g                            -> (m,)
// m (the number of constraints) is small, so the loops are sequential (deterministic sums).
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <optional>

#include "../common.h"
#include "../augmented_lagrangian.h"

namespace entangle_ext {
namespace {

void dual_update_cpu(const at::Tensor& lam, const at::Tensor& g, const at::Tensor& mu,
                     c10::string_view kind_s, std::optional<double> lam_min,
                     std::optional<double> lam_max, double damping, bool check_finite) {
  const char* op = "dual_update_";
  const int64_t mu_stride = check_dual_update_tensors(lam, g, mu, op);
  const ConstraintKind kind = parse_kind(kind_s, op);
  check_dual_update_args(kind, lam_min, lam_max, damping, op);
  const int64_t m = lam.size(0);
  AT_DISPATCH_FLOATING_TYPES(lam.scalar_type(), "dual_update_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    scalar_t* lp = lam.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* mp = mu.data_ptr<scalar_t>();
    if (check_finite) {  // validate everything before writing anything: lam stays unchanged
      for (int64_t i = 0; i < m; ++i) {
        TORCH_CHECK_VALUE(finite_value(gp[i]), op, ": g[", i, "] is non-finite (", gp[i],
                          "); lam was left unchanged");
        TORCH_CHECK_VALUE(finite_value(mp[i * mu_stride]), op, ": mu is non-finite (",
                          mp[i * mu_stride], "); lam was left unchanged");
      }
    }
    const acc_t keep = acc_t(1) - acc_t(damping);
    const acc_t lo = lam_min.has_value() ? acc_t(*lam_min) : acc_t(0);
    const acc_t hi = lam_max.has_value() ? acc_t(*lam_max) : acc_t(0);
    for (int64_t i = 0; i < m; ++i) {
      lp[i] = static_cast<scalar_t>(dual_step<acc_t>(
          acc_t(lp[i]), acc_t(gp[i]), acc_t(mp[i * mu_stride]), static_cast<int>(kind), keep,
          lam_min.has_value(), lo, lam_max.has_value(), hi));
    }
  });
}

at::Tensor al_forward_cpu(const at::Tensor& g, const at::Tensor& lam, const at::Tensor& mu,
                          c10::string_view kind_s) {
  const char* op = "augmented_lagrangian";
  const int64_t mu_stride = check_al_inputs(lam, g, mu, op);
  const int kind = static_cast<int>(parse_kind(kind_s, op));
  auto out = at::empty({}, g.options());
  const int64_t m = lam.size(0);
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "augmented_lagrangian_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* lp = lam.data_ptr<scalar_t>();
    const scalar_t* mp = mu.data_ptr<scalar_t>();
    acc_t s = 0;
    for (int64_t i = 0; i < m; ++i)
      s += al_term<acc_t>(acc_t(gp[i]), acc_t(lp[i]), acc_t(mp[i * mu_stride]), kind);
    *out.data_ptr<scalar_t>() = static_cast<scalar_t>(s);
  });
  return out;
}

at::Tensor al_backward_cpu(const at::Tensor& grad, const at::Tensor& g, const at::Tensor& lam,
                           const at::Tensor& mu, c10::string_view kind_s) {
  const char* op = "augmented_lagrangian_backward";
  const int64_t mu_stride = check_al_backward_inputs(grad, g, lam, mu, op);
  const int kind = static_cast<int>(parse_kind(kind_s, op));
  auto out = at::empty_like(g);
  const int64_t m = lam.size(0);
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "augmented_lagrangian_backward_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* lp = lam.data_ptr<scalar_t>();
    const scalar_t* mp = mu.data_ptr<scalar_t>();
    const acc_t w = acc_t(*grad.data_ptr<scalar_t>());
    scalar_t* op_ = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < m; ++i)
      op_[i] = static_cast<scalar_t>(
          w * al_grad<acc_t>(acc_t(gp[i]), acc_t(lp[i]), acc_t(mp[i * mu_stride]), kind));
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CPU, m) {
  m.impl("dual_update_", &dual_update_cpu);
  m.impl("augmented_lagrangian", &al_forward_cpu);
  m.impl("augmented_lagrangian_backward", &al_backward_cpu);
}

}  // namespace entangle_ext
