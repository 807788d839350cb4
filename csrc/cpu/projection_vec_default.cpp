// Baseline (no extra instruction set) build of the vectorised projection kernels; always available.
#include "projection_vec.h"

#define ENTANGLE_PROJ_NS cpu_default
#define ENTANGLE_PROJ_NAME "default"
#include "projection_vec_impl.h"

namespace entangle_ext {
const ProjCpuKernels* proj_kernels_default() { return &cpu_default::kKernels; }
}  // namespace entangle_ext
