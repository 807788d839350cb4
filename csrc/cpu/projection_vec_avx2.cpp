// AVX2 build of the vectorised projection kernels (x86-64 with GCC or Clang). The instruction set
// is enabled by a target pragma around the kernels only, after every generic header, so nothing
// outside them is compiled for AVX2; proj_kernels_avx2() also checks the running CPU.
#include "projection_vec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENTANGLE_PROJ_AVX2
#define ENTANGLE_PROJ_NS cpu_avx2
#define ENTANGLE_PROJ_NAME "avx2"
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
// GCC 12 reports its own AVX-512 conversion intrinsics as "maybe uninitialized" (false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma")
#endif

#include "projection_vec_impl.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace entangle_ext {
const ProjCpuKernels* proj_kernels_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok ? &cpu_avx2::kKernels : nullptr;
}
}  // namespace entangle_ext
#else
namespace entangle_ext {
const ProjCpuKernels* proj_kernels_avx2() { return nullptr; }
}  // namespace entangle_ext
#endif
