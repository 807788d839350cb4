// Device code of the projection operators (included by csrc/cuda/projection.cu only): the
// launch argument struct, the pass-1 / rescue / finish / pass-2 kernels and the one-thread solve.
// Index logic and the float64 solve come from csrc/projection.h, shared with the CPU kernels.
//
// Bytes-moved model (the floor for any two-pass method): pass 1 reads g and k basis rows, pass 2
// reads them again and writes g: (2k + 3) * P elements = (2k + 3) * 4 * P bytes in float32. The
// slots (blocks x (k+1)(k+2)/2 doubles) add < 0.1 % at P >= 1M. bench/bench_projection.py reports
// the achieved bandwidth on this model as a fraction of a measured device-to-device copy.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>

#include "../projection.h"

namespace entangle_ext {
namespace {

constexpr int64_t kChunk = 16384;  // elements per chunk
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Per basis bucket: bytes and elements per vector load, loads in flight per thread (unroll) and the pass-1
// occupancy bound. KMAX = 8 keeps 45 float64 accumulators per thread: __launch_bounds__(256, 2)
// caps it at 128 registers so that two blocks stay resident per SM, and loads of two elements (8
// bytes for float32) keep the 9 rows of a tile within that budget (no spills in the tile loop).
template <int KMAX> struct Tune;
template <> struct Tune<2> {
  static constexpr int kMaxBytes = 16, kMaxElems = 8, kUnroll = 2, kMinBlocks = 4;
};
template <> struct Tune<4> {
  static constexpr int kMaxBytes = 16, kMaxElems = 4, kUnroll = 1, kMinBlocks = 3;
};
template <> struct Tune<8> {
  static constexpr int kMaxBytes = 8, kMaxElems = 2, kUnroll = 1, kMinBlocks = 2;
};
template <typename T, int KMAX>
constexpr int vec_bytes() {
  constexpr int by_elems = Tune<KMAX>::kMaxElems * int(sizeof(T));
  return Tune<KMAX>::kMaxBytes < by_elems ? Tune<KMAX>::kMaxBytes : by_elems;
}

template <int KMAX>
struct ProjArgs {
  static constexpr int NT = proj_group_capacity(KMAX);
  const void* g[NT];
  void* out[NT];
  const void* v[KMAX][NT];
  int64_t numel[NT];
  int64_t chunk_prefix[NT + 1];
  uint8_t aligned[NT];  // every pointer of the tensor 16-byte aligned: vector loads
  int nseg;
};
static_assert(sizeof(ProjArgs<2>) <= 3900, "kernel argument struct too large");
static_assert(sizeof(ProjArgs<4>) <= 3900, "kernel argument struct too large");
static_assert(sizeof(ProjArgs<8>) <= 3900, "kernel argument struct too large");

template <typename T, int BYTES>
struct alignas(BYTES) Pack {
  static constexpr int N = BYTES / sizeof(T);
  T x[N];
};

template <typename T, int B>
__device__ __forceinline__ Pack<T, B> load_pack(const void* base, int64_t e) {
  return *reinterpret_cast<const Pack<T, B>*>(static_cast<const T*>(base) + e);
}

template <typename T>
__device__ __forceinline__ double to_d(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
__device__ __forceinline__ double to_d<double>(double x) {
  return x;
}

// Device work area of the fused op: coefficients of pass 2, row scales (k + 1), rescue flag.
struct Work {
  double c_apply[kProjMaxK];
  double scale[kProjMaxK + 1];
  int rescue;
};

// Block reduction of M per-thread values in a fixed order (deterministic, no atomics): warp
// shuffles, then warps 0..kWarps-1 in order; out[m] is written by threads m, m + kThreads, ...
template <int M, bool MAX>
__device__ __forceinline__ void block_reduce_fixed(const double (&acc)[M], double (*smem)[M],
                                                   double* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    double x = acc[m];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const double y = __shfl_down_sync(0xffffffffu, x, o);
      x = MAX ? fmax(x, y) : x + y;
    }
    if (lane == 0) smem[warp][m] = x;
  }
  __syncthreads();
  for (int m = threadIdx.x; m < M; m += kThreads) {
    double s = smem[0][m];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s = MAX ? fmax(s, smem[w][m]) : s + smem[w][m];
    out[m] = s;
  }
}

// The chunk c of a launch: its tensor slot s, first element and length.
template <int KMAX>
__device__ __forceinline__ int locate(const ProjArgs<KMAX>& a, int64_t c, int64_t* start, int64_t* len) {
  const int s = proj_locate_segment(a.chunk_prefix, a.nseg, c);
  proj_chunk_span(a.numel[s], c - a.chunk_prefix[s], kChunk, start, len);
  return s;
}

// Adds the products of one element's rows (vd[0..KMAX-1] basis, gd = g) to the packed Gram; g.g
// only when GG (float64 inputs: the rescue test needs it; other dtypes cannot under-/overflow).
template <int KMAX, bool GG>
__device__ __forceinline__ void gram_add(double (&acc)[proj_num_acc(KMAX)], const double (&vd)[KMAX],
                                         double gd) {
#pragma unroll
  for (int i = 0; i < KMAX; ++i) {
#pragma unroll
    for (int j = 0; j <= i; ++j) acc[tri_index(i, j)] = fma(vd[i], vd[j], acc[tri_index(i, j)]);
    acc[tri_index(KMAX, i)] = fma(vd[i], gd, acc[tri_index(KMAX, i)]);
  }
  if (GG) acc[tri_index(KMAX, KMAX)] = fma(gd, gd, acc[tri_index(KMAX, KMAX)]);
}

// ------------------------------------------------------------------------------------------------
// Pass 1. scale: k + 1 factors (g last) when SCALED; gate: run only if *gate != 0 (rescue pass).
// ------------------------------------------------------------------------------------------------
template <typename T, int KMAX, bool SCALED>
__global__ void __launch_bounds__(kThreads, Tune<KMAX>::kMinBlocks)
proj_pass1_kernel(const ProjArgs<KMAX> a, int k, const double* __restrict__ scale,
                  const int* __restrict__ gate, int64_t slot_base, double* __restrict__ partials) {
  if (gate != nullptr && *gate == 0) return;
  constexpr int M = proj_num_acc(KMAX);
  constexpr int B = vec_bytes<T, KMAX>();
  constexpr int VEC = B / sizeof(T);
  constexpr int U = Tune<KMAX>::kUnroll;
  constexpr int64_t TILE = int64_t(kThreads) * VEC * U;
  double sc[KMAX], scg = 1.0;
#pragma unroll
  for (int i = 0; i < KMAX; ++i) sc[i] = (SCALED && i < k) ? scale[i] : 1.0;
  if (SCALED) scg = scale[k];
  double acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0;
  const int64_t nchunks = a.chunk_prefix[a.nseg];
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    int64_t start, len;
    const int s = locate(a, c, &start, &len);
    const T* g = static_cast<const T*>(a.g[s]) + start;
    int64_t done = 0;
    if (a.aligned[s]) {
      done = len / TILE * TILE;
      for (int64_t t0 = 0; t0 < done; t0 += TILE) {
        Pack<T, B> pg[U], pv[KMAX][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // every load of the tile first
          const int64_t e = t0 + (int64_t(u) * kThreads + threadIdx.x) * VEC;
          pg[u] = *reinterpret_cast<const Pack<T, B>*>(g + e);
#pragma unroll
          for (int i = 0; i < KMAX; ++i)
            if (i < k) pv[i][u] = load_pack<T, B>(a.v[i][s], start + e);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int q = 0; q < VEC; ++q) {
            double vd[KMAX];
#pragma unroll
            for (int i = 0; i < KMAX; ++i) vd[i] = i < k ? to_d(pv[i][u].x[q]) * sc[i] : 0.0;
            gram_add<KMAX, std::is_same<T, double>::value>(acc, vd, to_d(pg[u].x[q]) * scg);
          }
      }
    }
    for (int64_t e = done + threadIdx.x; e < len; e += kThreads) {
      double vd[KMAX];
#pragma unroll
      for (int i = 0; i < KMAX; ++i)
        vd[i] = i < k ? to_d(static_cast<const T*>(a.v[i][s])[start + e]) * sc[i] : 0.0;
      gram_add<KMAX, std::is_same<T, double>::value>(acc, vd, to_d(g[e]) * scg);
    }
  }
  __shared__ double smem[kWarps][M];
  block_reduce_fixed<M, false>(acc, smem, partials + (slot_base + blockIdx.x) * M);
}

// ------------------------------------------------------------------------------------------------
// Rescue pass (float64, gated): max |row| per block for the KMAX basis rows and g (last).
// ------------------------------------------------------------------------------------------------
template <typename T, int KMAX>
__global__ void __launch_bounds__(kThreads)
proj_absmax_kernel(const ProjArgs<KMAX> a, int k, const int* __restrict__ gate, int64_t slot_base,
                   double* __restrict__ partials) {
  if (*gate == 0) return;
  double m[KMAX + 1];
#pragma unroll
  for (int r = 0; r <= KMAX; ++r) m[r] = 0.0;
  const int64_t nchunks = a.chunk_prefix[a.nseg];
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    int64_t start, len;
    const int s = locate(a, c, &start, &len);
    for (int64_t e = start + threadIdx.x; e < start + len; e += kThreads) {
#pragma unroll
      for (int i = 0; i < KMAX; ++i)
        if (i < k) m[i] = fmax(m[i], fabs(to_d(static_cast<const T*>(a.v[i][s])[e])));
      m[KMAX] = fmax(m[KMAX], fabs(to_d(static_cast<const T*>(a.g[s])[e])));
    }
  }
  __shared__ double smem[kWarps][KMAX + 1];
  block_reduce_fixed<KMAX + 1, true>(m, smem, partials + (slot_base + blockIdx.x) * (KMAX + 1));
}

// ------------------------------------------------------------------------------------------------
// Finish (one block): fixed-order sum of the slots, then thread 0 acts by mode.
// ------------------------------------------------------------------------------------------------
enum FinishMode : int { kSolve = 0, kSolveOrFlag = 1, kRescueSolve = 2, kScales = 3, kGram = 4 };

template <int KMAX>
__global__ void __launch_bounds__(kThreads)
proj_finish_kernel(const double* __restrict__ partials, int64_t nslots, int k, double rcond,
                   double shift, int mode, Work* __restrict__ work, double* __restrict__ out1,
                   double* __restrict__ out2) {
  if (mode == kRescueSolve || mode == kScales) {
    if (work->rescue == 0) return;
  }
  constexpr int M = proj_num_acc(KMAX);
  const int W = mode == kScales ? KMAX + 1 : M;  // slot width
  double acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0;
  for (int64_t s = threadIdx.x; s < nslots; s += kThreads)
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (m < W) acc[m] = mode == kScales ? fmax(acc[m], partials[s * W + m]) : acc[m] + partials[s * W + m];
  __shared__ double smem[kWarps][M];
  __shared__ double total[M];
  if (mode == kScales) {
    block_reduce_fixed<M, true>(acc, smem, total);
  } else {
    block_reduce_fixed<M, false>(acc, smem, total);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (mode == kScales) {  // amax -> power-of-two scales (g last)
    for (int i = 0; i < k; ++i) work->scale[i] = proj_pow2_scale(total[i]);
    work->scale[k] = proj_pow2_scale(total[KMAX]);
    return;
  }
  if (mode == kGram) {  // out1 = G (k, k), out2 = b (k,)
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j <= i; ++j) out1[i * k + j] = out1[j * k + i] = total[tri_index(i, j)];
      out2[i] = total[tri_index(KMAX, i)];
    }
    return;
  }
  if (mode == kSolveOrFlag) {
    work->rescue = proj_needs_rescue(total, KMAX, k) ? 1 : 0;
    for (int i = 0; i <= k; ++i) work->scale[i] = 1.0;
    if (work->rescue) return;
  }
  double c_user[kProjMaxK];
  proj_finish(total, KMAX, k, rcond, shift, mode == kRescueSolve ? work->scale : nullptr,
              work->c_apply, c_user);
  for (int i = 0; i < k; ++i) out1[i] = c_user[i];
}

// ------------------------------------------------------------------------------------------------
// Pass 2: out = g - sum_i c_i (scale_i v_i) (scale: k factors, or nullptr), chunks in reverse.
// ------------------------------------------------------------------------------------------------
template <typename T, int KMAX>
__global__ void __launch_bounds__(kThreads)
proj_pass2_kernel(const ProjArgs<KMAX> a, int k, const double* __restrict__ coeffs,
                  const double* __restrict__ scale) {
  constexpr int B = 16, VEC = B / sizeof(T), U = KMAX == 2 ? 2 : 1;  // no accumulators: 16-byte loads
  constexpr int64_t TILE = int64_t(kThreads) * VEC * U;
  double c[KMAX], sc[KMAX];
#pragma unroll
  for (int i = 0; i < KMAX; ++i) {
    c[i] = i < k ? coeffs[i] : 0.0;
    sc[i] = (i < k && scale != nullptr) ? scale[i] : 1.0;
  }
  const int64_t nchunks = a.chunk_prefix[a.nseg];
  for (int64_t ci = blockIdx.x; ci < nchunks; ci += gridDim.x) {
    int64_t start, len;
    const int s = locate(a, proj_reverse(ci, nchunks), &start, &len);
    const T* g = static_cast<const T*>(a.g[s]) + start;  // may alias out (in place)
    T* out = static_cast<T*>(a.out[s]) + start;
    int64_t done = 0;
    if (a.aligned[s]) {
      done = len / TILE * TILE;
      for (int64_t t0 = 0; t0 < done; t0 += TILE) {
        Pack<T, B> pg[U], pv[KMAX][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t e = t0 + (int64_t(u) * kThreads + threadIdx.x) * VEC;
          pg[u] = *reinterpret_cast<const Pack<T, B>*>(g + e);
#pragma unroll
          for (int i = 0; i < KMAX; ++i)
            if (i < k) pv[i][u] = load_pack<T, B>(a.v[i][s], start + e);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          Pack<T, B> po;
#pragma unroll
          for (int q = 0; q < VEC; ++q) {
            double r = to_d(pg[u].x[q]);
#pragma unroll
            for (int i = 0; i < KMAX; ++i)
              if (i < k) r = fma(to_d(pv[i][u].x[q]) * sc[i], -c[i], r);
            po.x[q] = static_cast<T>(r);
          }
          *reinterpret_cast<Pack<T, B>*>(out + t0 + (int64_t(u) * kThreads + threadIdx.x) * VEC) = po;
        }
      }
    }
    for (int64_t e = done + threadIdx.x; e < len; e += kThreads) {
      double r = to_d(g[e]);
#pragma unroll
      for (int i = 0; i < KMAX; ++i)
        if (i < k) r = fma(to_d(static_cast<const T*>(a.v[i][s])[start + e]) * sc[i], -c[i], r);
      out[e] = static_cast<T>(r);
    }
  }
}

__global__ void proj_solve_kernel(const double* __restrict__ gram, const double* __restrict__ vg, int k,
                                  double rcond, double shift, double* __restrict__ c) {
  double packed[proj_num_acc(kProjMaxK)] = {}, sh[kProjMaxK] = {};
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j <= i; ++j) packed[tri_index(i, j)] = gram[i * k + j];
    sh[i] = shift;
  }
  solve_projection_coeffs(packed, vg, k, rcond, sh, c);
}

}  // namespace
}  // namespace entangle_ext
