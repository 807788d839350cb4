// Host-and-device helpers of the augmented-Lagrangian operators (entangle_ext::dual_update_,
// augmented_lagrangian, augmented_lagrangian_backward), shared by csrc/cpu/augmented_lagrangian.cpp
// and csrc/cuda/augmented_lagrangian.cu: the structural argument checks (host) and the per-entry
// math dual_step / al_term / al_grad (ENTANGLE_HD: compiled for both, so the CPU tests exercise the
// very code the CUDA kernels run). docs/algorithm.md §2 (the term) and §6 (the dual update).
// Value checks (finite g / mu) need the data; they live in the kernels (CPU: always cheap; CUDA:
// only with check_finite=True, which costs one host sync). m = 0 constraints is valid: the term
// is 0, its gradient empty, and the dual update a no-op.
#pragma once

#include <c10/util/string_view.h>

#include <cmath>
#include <optional>
#include <string>

#include "common.h"
#include "overlap.h"

namespace entangle_ext {

enum class ConstraintKind : int { kEquality = 0, kInequality = 1 };

inline ConstraintKind parse_kind(c10::string_view kind, const char* op) {
  const std::string k(kind.data(), kind.size());
  if (k == "equality") return ConstraintKind::kEquality;
  if (k == "inequality") return ConstraintKind::kInequality;
  TORCH_CHECK_VALUE(false, op, ": kind must be 'equality' or 'inequality', got '", k, "'");
  return ConstraintKind::kEquality;
}

// lam (m,) float32/float64 contiguous; g (m,) same dtype/device; mu () or (m,) same dtype/device
// (a (1,) mu for m > 1 is refused, not broadcast). Returns the stride of mu (0 when 0-d).
inline int64_t check_al_inputs(const at::Tensor& lam, const at::Tensor& g, const at::Tensor& mu,
                               const char* op) {
  check_dim(lam, 1, op, "lam");
  check_floating(lam, op, "lam");
  check_contiguous(lam, op, "lam");
  const int64_t m = lam.size(0);
  TORCH_CHECK_VALUE(g.dim() == 1 && g.size(0) == m, op, ": g must have shape (m,) = (", m,
                    ",) like lam, got ", shape_str(g));
  TORCH_CHECK_VALUE(mu.dim() == 0 || (mu.dim() == 1 && mu.size(0) == m), op,
                    ": mu must have shape () or (m,) = (", m, ",), got ", shape_str(mu),
                    (mu.dim() == 1 && mu.numel() == 1) ? " (a (1,) mu is not broadcast: give a 0-d one)" : "");
  TORCH_CHECK_TYPE(g.scalar_type() == lam.scalar_type(), op, ": g is ", dtype_name(g),
                   " but lam is ", dtype_name(lam), " (same dtype required)");
  TORCH_CHECK_TYPE(mu.scalar_type() == lam.scalar_type(), op, ": mu is ", dtype_name(mu),
                   " but lam is ", dtype_name(lam), " (same dtype required)");
  check_contiguous(g, op, "g");
  check_contiguous(mu, op, "mu");
  check_same_device(lam, g, op, "lam", "g");
  check_same_device(lam, mu, op, "lam", "mu");
  return (mu.dim() == 0) ? 0 : 1;
}

// dual_update_'s tensor checks: those of check_al_inputs, then lam (written in place) shares no
// memory with g or mu (ValueError; csrc/overlap.h). Returns the stride of mu.
inline int64_t check_dual_update_tensors(const at::Tensor& lam, const at::Tensor& g,
                                         const at::Tensor& mu, const char* op) {
  const int64_t mu_stride = check_al_inputs(lam, g, mu, op);
  check_inplace_disjoint(op, {{at::TensorList(lam), "lam", false, true},
                              {at::TensorList(g), "g", false, false},
                              {at::TensorList(mu), "mu", false, false}});
  return mu_stride;
}

inline void check_dual_update_args(ConstraintKind kind, std::optional<double> lam_min,
                                   std::optional<double> lam_max, double damping, const char* op) {
  TORCH_CHECK_VALUE(damping >= 0.0 && damping <= 1.0, op, ": damping must be in [0, 1], got ",
                    damping);
  if (lam_min.has_value() && lam_max.has_value()) {
    TORCH_CHECK_VALUE(*lam_min <= *lam_max, op, ": lam_min (", *lam_min, ") > lam_max (",
                      *lam_max, ")");
  }
  TORCH_CHECK_VALUE(!lam_min.has_value() || !std::isnan(*lam_min), op, ": lam_min is NaN");
  TORCH_CHECK_VALUE(!lam_max.has_value() || !std::isnan(*lam_max), op, ": lam_max is NaN");
  if (kind == ConstraintKind::kInequality && lam_max.has_value()) {
    TORCH_CHECK_VALUE(*lam_max >= 0.0, op, ": an inequality multiplier is >= 0, so lam_max must be "
                      ">= 0, got ", *lam_max);
  }
}

// The checks of check_al_inputs plus those of the 0-d upstream gradient; returns the stride of mu.
inline int64_t check_al_backward_inputs(const at::Tensor& grad, const at::Tensor& g,
                                        const at::Tensor& lam, const at::Tensor& mu, const char* op) {
  const int64_t mu_stride = check_al_inputs(lam, g, mu, op);
  TORCH_CHECK_VALUE(grad.numel() == 1 && grad.dim() == 0, op, ": grad must be a 0-d tensor, got ",
                    shape_str(grad));
  TORCH_CHECK_TYPE(grad.scalar_type() == lam.scalar_type(), op, ": grad is ", dtype_name(grad),
                   " but lam is ", dtype_name(lam));
  check_same_device(lam, grad, op, "lam", "grad");
  return mu_stride;
}

// ---------------------------------------------------------------------------------------------
// Per-entry math (acc_t arithmetic).
// ---------------------------------------------------------------------------------------------
template <typename T>
ENTANGLE_HD bool finite_value(T x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// One dual step: t = (1 - damping) * lam + mu * g; inequality: t = max(0, t); then clip to
// [lo, hi] (has_lo / has_hi). Entries with non-finite g or mu keep lam. Every comparison is
// written so that a NaN lam stays NaN, as torch.clamp and the reference keep it (`t > 0 ? t : 0`
// turned a NaN multiplier into 0, hiding the corrupted state).
template <typename acc_t>
ENTANGLE_HD acc_t dual_step(acc_t lam, acc_t g, acc_t mu, int kind, acc_t keep, bool has_lo,
                            acc_t lo, bool has_hi, acc_t hi) {
  if (!finite_value(g) || !finite_value(mu)) return lam;
  acc_t t = keep * lam + mu * g;
  if (kind == static_cast<int>(ConstraintKind::kInequality)) t = t < acc_t(0) ? acc_t(0) : t;
  if (has_lo) t = t < lo ? lo : t;
  if (has_hi) t = t > hi ? hi : t;
  return t;
}

// Augmented-Lagrangian term of one entry.
//   equality:   lam*g + (mu/2) g^2
//   inequality: (1/(2 mu)) (max(0, lam + mu g)^2 - lam^2)
//             = lam*g + (mu/2) g^2   when lam + mu g > 0   (no division: exact for any mu)
//             = -lam^2 / (2 mu)      otherwise (0 when lam == 0)
// A NaN lam + mu g counts as active, so a NaN g gives a NaN term and gradient as the equality form
// does (`lam + mu g > 0` was false for NaN: the entry read as inactive, a finite term and a zero
// gradient, and the NaN check of the loss saw nothing).
template <typename acc_t>
ENTANGLE_HD acc_t al_term(acc_t g, acc_t lam, acc_t mu, int kind) {
  const acc_t active = lam * g + acc_t(0.5) * mu * g * g;
  if (kind == static_cast<int>(ConstraintKind::kEquality)) return active;
  if (!(lam + mu * g <= acc_t(0))) return active;
  if (lam == acc_t(0)) return acc_t(0);
  return -(lam * lam) / (acc_t(2) * mu);
}

// d term / d g: equality lam + mu g; inequality max(0, lam + mu g).
template <typename acc_t>
ENTANGLE_HD acc_t al_grad(acc_t g, acc_t lam, acc_t mu, int kind) {
  const acc_t t = lam + mu * g;
  if (kind == static_cast<int>(ConstraintKind::kEquality)) return t;
  return t <= acc_t(0) ? acc_t(0) : t;   // NaN stays NaN, as in al_term
}

}  // namespace entangle_ext
