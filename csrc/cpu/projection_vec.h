// Interface of the vectorised CPU kernels of the projection operators. The kernels themselves
// (projection_vec_impl.h) are compiled once per CPU capability - projection_vec_{default,avx2,
// avx512}.cpp - and csrc/cpu/projection.cpp picks one at run time with the capability torch itself
// dispatches on (at::get_cpu_capability(), which honours ATEN_CPU_CAPABILITY). No -march flags: the
// wide variants enable their instruction sets for their own functions only (target pragmas).
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../projection.h"

namespace entangle_ext {

// One chunk of n elements of the k basis rows v[0..k-1], g and the output of pass 2 (may alias g).
// All rows share one element order (same memory layout) and the dtype of the call.
struct ProjChunk {
  const void* v[kProjMaxK];
  const void* g;
  void* out;
  int64_t n;
  int k;
};

struct ProjCpuKernels {
  const char* name;
  // acc[proj_num_acc(k)] = packed lower triangle of the float64 Gram of the rows
  // [scale_0 v_0, ..., scale_{k-1} v_{k-1}, scale_k g] (tri_index layout, g is row k);
  // scale: k + 1 factors or nullptr (all 1).
  void (*pass1)(at::ScalarType, const ProjChunk&, const double* scale, double* acc);
  // out = g - sum_i c[i] * (scale_i v_i), computed in float64 and rounded once; scale: k or nullptr.
  void (*pass2)(at::ScalarType, const ProjChunk&, const double* c, const double* scale);
  // amax[r] = max |row r| over the chunk for the k basis rows and g (r = k); NaN propagates.
  void (*absmax)(at::ScalarType, const ProjChunk&, double* amax);
};

// Each returns nullptr when its variant is not compiled for this compiler/architecture.
const ProjCpuKernels* proj_kernels_default();
const ProjCpuKernels* proj_kernels_avx2();
const ProjCpuKernels* proj_kernels_avx512();

}  // namespace entangle_ext
