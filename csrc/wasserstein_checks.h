// Structural argument checks of entangle_ext::wasserstein2_1d, shared by the CPU and CUDA kernels.
// Value checks that need the data (finite values, monotone offsets, non-empty segments) live in
// the Python wrapper (entangle_ext/wasserstein.py), because on CUDA they cost a host sync.
#pragma once

#include "common.h"

namespace entangle_ext {

inline void check_w2_inputs(const at::Tensor& u, const at::Tensor& v, const at::Tensor& u_offsets,
                            const at::Tensor& v_offsets, const char* op) {
  check_dim(u, 1, op, "u");
  check_dim(v, 1, op, "v");
  check_floating(u, op, "u");
  TORCH_CHECK_TYPE(u.scalar_type() == v.scalar_type(), op, ": u is ", u.scalar_type(), " but v is ",
                   v.scalar_type());
  check_contiguous(u, op, "u");
  check_contiguous(v, op, "v");
  check_offsets(u_offsets, op, "u_offsets");
  check_offsets(v_offsets, op, "v_offsets");
  TORCH_CHECK_VALUE(u_offsets.numel() == v_offsets.numel(), op,
                    ": u and v must have the same number of segments, got ",
                    u_offsets.numel() - 1, " and ", v_offsets.numel() - 1);
  check_same_device(u, v, op, "u", "v");
  check_same_device(u, u_offsets, op, "u", "u_offsets");
  check_same_device(u, v_offsets, op, "u", "v_offsets");
}

inline void check_w2_backward_inputs(const at::Tensor& grad, const at::Tensor& u,
                                     const at::Tensor& v, const at::Tensor& u_offsets,
                                     const at::Tensor& v_offsets, const at::Tensor& u_perm,
                                     const at::Tensor& v_perm) {
  const char* op = "wasserstein2_1d_backward";
  check_w2_inputs(u, v, u_offsets, v_offsets, op);
  check_dim(grad, 1, op, "grad");
  TORCH_CHECK_VALUE(grad.numel() == u_offsets.numel() - 1, op, ": grad must have one entry per segment");
  TORCH_CHECK_TYPE(grad.scalar_type() == u.scalar_type(), op, ": grad dtype ", grad.scalar_type(),
                   " differs from u dtype ", u.scalar_type());
  check_contiguous(grad, op, "grad");
  check_same_device(u, grad, op, "u", "grad");
  for (const at::Tensor* p : {&u_perm, &v_perm}) {
    TORCH_CHECK_TYPE(p->scalar_type() == at::kLong, op, ": sort permutations must be int64");
    check_contiguous(*p, op, "perm");
    check_same_device(u, *p, op, "u", "perm");
  }
  TORCH_CHECK_VALUE(u_perm.numel() == u.numel() && v_perm.numel() == v.numel(), op,
                    ": permutation sizes must match u and v");
}

}  // namespace entangle_ext
