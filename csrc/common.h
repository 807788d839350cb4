// Shared helpers for every entangle_ext operator (CPU and CUDA translation units).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define ENTANGLE_HD __host__ __device__ __forceinline__
#else
#define ENTANGLE_HD inline
#endif

namespace entangle_ext {

// ---------------------------------------------------------------------------------------------
// Argument checks. They raise ValueError/TypeError in Python (TORCH_CHECK_VALUE / _TYPE).
// ---------------------------------------------------------------------------------------------
inline void check_floating(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
                   " must be float32 or float64 (got ", t.scalar_type(),
                   "); the Python wrapper upcasts float16/bfloat16");
}

inline void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name,
                    " must be contiguous; call .contiguous() first");
}

inline void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must have ", dim, " dimension(s), got shape ",
                    t.sizes());
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op,
                              const char* na, const char* nb) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", na, " is on ", a.device(), " but ", nb,
                    " is on ", b.device());
}

inline void check_offsets(const at::Tensor& off, const char* op, const char* name) {
  TORCH_CHECK_TYPE(off.scalar_type() == at::kLong, op, ": ", name,
                   " must be int64 (the Python wrapper converts int32 cu_seqlens)");
  check_dim(off, 1, op, name);
  check_contiguous(off, op, name);
  TORCH_CHECK_VALUE(off.numel() >= 2, op, ": ", name,
                    " must hold S+1 >= 2 prefix sums (cu_seqlens convention)");
}

// ---------------------------------------------------------------------------------------------
// Exact 1-D Wasserstein-2 between two sorted empirical distributions with uniform weights.
// Sample i of a (size na) covers quantiles [i/na, (i+1)/na); sample j of b (size nb) covers
// [j/nb, (j+1)/nb). In integer units of 1/(na*nb) their overlap is
//   w_ij = max(0, min((i+1)*nb, (j+1)*na) - max(i*nb, j*na)),
// and W2^2 = sum_ij w_ij (a_i - b_j)^2 / (na*nb). Only O(na+nb) pairs overlap.
// ---------------------------------------------------------------------------------------------

// The range [j_lo, j_hi] (inclusive) of b-samples that overlap a-sample i.
ENTANGLE_HD void overlap_range(int64_t i, int64_t na, int64_t nb, int64_t* j_lo, int64_t* j_hi) {
  *j_lo = (i * nb) / na;
  *j_hi = ((i + 1) * nb - 1) / na;
}

ENTANGLE_HD int64_t overlap_weight(int64_t i, int64_t j, int64_t na, int64_t nb) {
  const int64_t lo = (i * nb > j * na) ? i * nb : j * na;
  const int64_t hi = ((i + 1) * nb < (j + 1) * na) ? (i + 1) * nb : (j + 1) * na;
  return hi > lo ? hi - lo : 0;
}

// sum_j w_ij (a_i - b_j)^2 for one a-sample i (b is the other side's sorted segment).
template <typename acc_t, typename val_t>
ENTANGLE_HD acc_t w2_row_cost(const val_t* b, int64_t i, acc_t ai, int64_t na, int64_t nb) {
  if (na == nb) {  // equal sizes: rank pairing, w_ii = n (skips the 64-bit integer divisions)
    const acc_t d = ai - static_cast<acc_t>(b[i]);
    return static_cast<acc_t>(na) * d * d;
  }
  int64_t j_lo, j_hi;
  overlap_range(i, na, nb, &j_lo, &j_hi);
  acc_t s = 0;
  for (int64_t j = j_lo; j <= j_hi; ++j) {
    const acc_t d = ai - static_cast<acc_t>(b[j]);
    s += static_cast<acc_t>(overlap_weight(i, j, na, nb)) * d * d;
  }
  return s;
}

// sum_j w_ij (a_i - b_j) for one a-sample i: d W2^2 / d a_(i) = 2 * this / (na*nb).
template <typename acc_t, typename val_t>
ENTANGLE_HD acc_t w2_row_grad(const val_t* b, int64_t i, acc_t ai, int64_t na, int64_t nb) {
  if (na == nb) return static_cast<acc_t>(na) * (ai - static_cast<acc_t>(b[i]));  // w_ii = n
  int64_t j_lo, j_hi;
  overlap_range(i, na, nb, &j_lo, &j_hi);
  acc_t s = 0;
  for (int64_t j = j_lo; j <= j_hi; ++j) {
    s += static_cast<acc_t>(overlap_weight(i, j, na, nb)) * (ai - static_cast<acc_t>(b[j]));
  }
  return s;
}

}  // namespace entangle_ext
