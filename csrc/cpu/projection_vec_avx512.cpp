// AVX512 build of the vectorised projection kernels (x86-64 with GCC or Clang). The instruction set
// is enabled by a target pragma around the kernels only, after every generic header, so nothing
// outside them is compiled for AVX512; proj_kernels_avx512() also checks the running CPU.
#include "projection_vec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENTANGLE_PROJ_AVX512
#define ENTANGLE_PROJ_NS cpu_avx512
#define ENTANGLE_PROJ_NAME "avx512"
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
// GCC 12 reports its own AVX-512 conversion intrinsics as "maybe uninitialized" (false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx2,fma")
#endif

#include "projection_vec_impl.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace entangle_ext {
const ProjCpuKernels* proj_kernels_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok ? &cpu_avx512::kKernels : nullptr;
}
}  // namespace entangle_ext
#else
namespace entangle_ext {
const ProjCpuKernels* proj_kernels_avx512() { return nullptr; }
}  // namespace entangle_ext
#endif
