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

// Messages spell dtypes and shapes as Python does ("torch.float32", "(2, 51)"), so an error from
// a raw torch.ops call reads like one from the Python wrappers.
inline std::string dtype_name(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t.scalar_type());
  }
}

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d) s += ", ";
    s += std::to_string(t.size(d));
  }
  return s + (t.dim() == 1 ? ",)" : ")");
}

// ---------------------------------------------------------------------------------------------
// Argument checks. They raise ValueError/TypeError in Python (TORCH_CHECK_VALUE / _TYPE).
// ---------------------------------------------------------------------------------------------
inline void check_floating(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
                   " must be float32 or float64 (got ", dtype_name(t),
                   "); the Python wrappers compute float16/bfloat16 data in float32, and "
                   "multipliers are kept in float32 or float64");
}

inline void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name,
                    " must be contiguous; call .contiguous() first");
}

inline void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must have ", dim, " dimension(s), got shape ",
                    shape_str(t));
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op,
                              const char* na, const char* nb) {
  TORCH_CHECK_VALUE(a.device() == b.device(), op, ": ", na, " is on ", a.device(), " but ", nb,
                    " is on ", b.device());
}

}  // namespace entangle_ext
