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
                   "); the Python wrappers compute float16/bfloat16 data in float32, and "
                   "multipliers are kept in float32 or float64");
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

}  // namespace entangle_ext
