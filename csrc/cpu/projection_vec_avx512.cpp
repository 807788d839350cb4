// AVX512 build of the vectorised projection kernels (x86-64 with GCC or Clang). projection_vec_impl.h
// compiles them under a target pragma for ENTANGLE_PROJ_TARGET only (after every generic header),
// so nothing outside them is compiled for AVX512; proj_kernels_avx512() also checks the running CPU.
#include "projection_vec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENTANGLE_PROJ_AVX512
#define ENTANGLE_PROJ_NS cpu_avx512
#define ENTANGLE_PROJ_NAME "avx512"
#define ENTANGLE_PROJ_TARGET "avx512f,avx2,fma"
#include <immintrin.h>
#include "projection_vec_impl.h"

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
