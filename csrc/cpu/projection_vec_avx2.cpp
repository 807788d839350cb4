// AVX2 build of the vectorised projection kernels (x86-64 with GCC or Clang). projection_vec_impl.h
// compiles them under a target pragma for ENTANGLE_PROJ_TARGET only (after every generic header),
// so nothing outside them is compiled for AVX2; proj_kernels_avx2() also checks the running CPU.
#include "projection_vec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENTANGLE_PROJ_AVX2
#define ENTANGLE_PROJ_NS cpu_avx2
#define ENTANGLE_PROJ_NAME "avx2"
#define ENTANGLE_PROJ_TARGET "avx2,fma"
#include <immintrin.h>
#include "projection_vec_impl.h"

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
