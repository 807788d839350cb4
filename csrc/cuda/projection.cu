// CUDA kernels of entangle_ext::project_orthogonal (flat) and project_orthogonal_ (in place over a
// tensor list): out = g - V^T c, c = (V V^T)^+ V g with a relative eigenvalue cutoff.
//
// Multi-tensor-apply style, written for this op: the host packs tensor addresses and sizes into a
// by-value kernel-argument struct (TensorListMeta) together with a block -> (tensor, chunk) table
// (chunks of kChunk elements) and launches whenever the struct is full. No flattening copies.
//  pass 1  (proj_pass1_kernel): one block per chunk reads g and the k basis vectors once and forms
//          the k(k+1)/2 Gram entries and k dot products in float64; the block writes them to its
//          own slot (slot = global chunk index, fixed by the shapes).
//  finish  (proj_finish_kernel): one block sums the slots in a fixed order (deterministic, no
//          atomics) and solves the k x k system in float64 on the device (projection.h: cyclic
//          Jacobi on the row-normalised Gram with a relative eigenvalue cutoff); writes coeffs.
//  pass 2  (proj_pass2_kernel): out = g - sum_i c_i v_i (float64 arithmetic, one rounding).
// Everything runs on the current stream with no host synchronisation: the op is CUDA-graph
// capturable and the coefficients never leave the device.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "../projection.h"

namespace entangle_ext {
namespace {

constexpr int64_t kChunk = 16384;  // elements per block (and per reduction slot)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
constexpr int kMaxBlocksPerLaunch = 320;

// Tensors per launch for a basis bucket of KMAX vectors, sized so that the struct stays under the
// 4 KiB kernel-parameter limit.
template <int KMAX>
struct ListCapacity;
template <>
struct ListCapacity<2> { static constexpr int value = 48; };
template <>
struct ListCapacity<4> { static constexpr int value = 36; };
template <>
struct ListCapacity<8> { static constexpr int value = 24; };

template <int KMAX>
struct TensorListMeta {
  static constexpr int NT = ListCapacity<KMAX>::value;
  const void* g[NT];
  void* out[NT];
  const void* v[KMAX][NT];
  int64_t numel[NT];
  int32_t block_to_chunk[kMaxBlocksPerLaunch];
  uint8_t block_to_tensor[kMaxBlocksPerLaunch];
};
static_assert(sizeof(TensorListMeta<2>) <= 3900, "kernel argument struct too large");
static_assert(sizeof(TensorListMeta<4>) <= 3900, "kernel argument struct too large");
static_assert(sizeof(TensorListMeta<8>) <= 3900, "kernel argument struct too large");

template <typename T>
__device__ __forceinline__ double to_d(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
__device__ __forceinline__ double to_d<double>(double x) {
  return x;
}
template <>
__device__ __forceinline__ double to_d<float>(float x) {
  return static_cast<double>(x);
}

// Block sum of M per-thread doubles in a fixed order (deterministic, no atomics): warp shuffles,
// then warps 0..kWarps-1 in order; out[m] is written by threads m, m + kThreads, ...
template <int M>
__device__ __forceinline__ void block_sum_fixed_order(const double (&acc)[M], double (*smem)[M],
                                                      double* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    double x = acc[m];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    if (lane == 0) smem[warp][m] = x;
  }
  __syncthreads();
  for (int m = threadIdx.x; m < M; m += kThreads) {
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += smem[w][m];
    out[m] = s;
  }
}

// ------------------------------------------------------------------------------------------------
// Pass 1: per-chunk Gram entries and V g.
// ------------------------------------------------------------------------------------------------
template <typename T, int KMAX>
__global__ void __launch_bounds__(kThreads)
proj_pass1_kernel(TensorListMeta<KMAX> meta, int k, int64_t slot_base, double* __restrict__ partials) {
  constexpr int M = proj_num_acc(KMAX);
  constexpr int NG = KMAX * (KMAX + 1) / 2;
  const int t = meta.block_to_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * kChunk;
  const int64_t n = meta.numel[t];
  const int64_t len = (n - start) < kChunk ? (n - start) : kChunk;
  const T* __restrict__ g = static_cast<const T*>(meta.g[t]) + start;
  const T* v[KMAX];
#pragma unroll
  for (int i = 0; i < KMAX; ++i) v[i] = i < k ? static_cast<const T*>(meta.v[i][t]) + start : nullptr;

  double acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0;

  for (int64_t base = threadIdx.x; base < len; base += kThreads * kUnroll) {
    T xg[kUnroll];
    T xv[KMAX][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t e = base + u * kThreads;
      const bool ok = e < len;
      xg[u] = ok ? g[e] : T(0);
#pragma unroll
      for (int i = 0; i < KMAX; ++i) xv[i][u] = (ok && i < k) ? v[i][e] : T(0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const double gd = to_d(xg[u]);
      double vd[KMAX];
#pragma unroll
      for (int i = 0; i < KMAX; ++i) vd[i] = to_d(xv[i][u]);
#pragma unroll
      for (int i = 0; i < KMAX; ++i) {
#pragma unroll
        for (int j = 0; j <= i; ++j) acc[tri_index(i, j)] += vd[i] * vd[j];
        acc[NG + i] += vd[i] * gd;
      }
    }
  }

  __shared__ double smem[kWarps][M];
  block_sum_fixed_order<M>(acc, smem, partials + (slot_base + blockIdx.x) * M);
}

// ------------------------------------------------------------------------------------------------
// Finish: fixed-order sum of the slots, then the float64 k x k solve (one thread).
// ------------------------------------------------------------------------------------------------
template <int KMAX>
__global__ void __launch_bounds__(kThreads)
proj_finish_kernel(const double* __restrict__ partials, int64_t nslots, int k, double rcond,
                   double* __restrict__ coeffs) {
  constexpr int M = proj_num_acc(KMAX);
  double acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0;
  for (int64_t s = threadIdx.x; s < nslots; s += kThreads) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] += partials[s * M + m];
  }
  __shared__ double smem[kWarps][M];
  __shared__ double total[M];
  block_sum_fixed_order<M>(acc, smem, total);
  __syncthreads();
  if (threadIdx.x == 0) {
    double c[kProjMaxK];
    solve_projection_coeffs(total, KMAX, k, rcond, c);
    for (int i = 0; i < k; ++i) coeffs[i] = c[i];
  }
}

// ------------------------------------------------------------------------------------------------
// Pass 2: out = g - V^T c.
// ------------------------------------------------------------------------------------------------
template <typename T, int KMAX>
__global__ void __launch_bounds__(kThreads)
proj_pass2_kernel(TensorListMeta<KMAX> meta, int k, const double* __restrict__ coeffs) {
  const int t = meta.block_to_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * kChunk;
  const int64_t n = meta.numel[t];
  const int64_t len = (n - start) < kChunk ? (n - start) : kChunk;
  const T* g = static_cast<const T*>(meta.g[t]) + start;  // may alias out (in place)
  T* out = static_cast<T*>(meta.out[t]) + start;
  const T* v[KMAX];
  double c[KMAX];
#pragma unroll
  for (int i = 0; i < KMAX; ++i) {
    v[i] = i < k ? static_cast<const T*>(meta.v[i][t]) + start : nullptr;
    c[i] = i < k ? coeffs[i] : 0.0;
  }
  for (int64_t base = threadIdx.x; base < len; base += kThreads * kUnroll) {
    double r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t e = base + u * kThreads;
      r[u] = e < len ? to_d(g[e]) : 0.0;
    }
#pragma unroll
    for (int i = 0; i < KMAX; ++i) {
      if (i < k) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t e = base + u * kThreads;
          if (e < len) r[u] -= c[i] * to_d(v[i][e]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t e = base + u * kThreads;
      if (e < len) out[e] = static_cast<T>(r[u]);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Host side: pack the lists into TensorListMeta structs and launch when full.
// ------------------------------------------------------------------------------------------------
struct HostLists {
  std::vector<const void*> g;
  std::vector<void*> out;
  std::vector<const void*> v;  // k * T, row-major by basis vector
  std::vector<int64_t> numel;
  int64_t T = 0;
};

// Calls launch(meta, nblocks, slot_base) for consecutive groups of chunks; slot_base + b is the
// global chunk index of block b. Empty tensors are skipped.
template <int KMAX, typename Launch>
void for_each_launch(const HostLists& L, int k, Launch&& launch) {
  constexpr int NT = TensorListMeta<KMAX>::NT;
  TensorListMeta<KMAX> meta;
  int nt = 0, nb = 0;
  int64_t slot_base = 0;
  auto set_tensor = [&](int slot, int64_t t) {
    meta.g[slot] = L.g[t];
    meta.out[slot] = L.out[t];
    meta.numel[slot] = L.numel[t];
    for (int i = 0; i < KMAX; ++i) meta.v[i][slot] = i < k ? L.v[i * L.T + t] : nullptr;
  };
  for (int64_t t = 0; t < L.T; ++t) {
    const int64_t n = L.numel[t];
    if (n == 0) continue;
    set_tensor(nt, t);
    ++nt;
    const int64_t nchunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < nchunks; ++c) {
      meta.block_to_tensor[nb] = static_cast<uint8_t>(nt - 1);
      meta.block_to_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c == nchunks - 1;
      if (nb == kMaxBlocksPerLaunch || (nt == NT && last_chunk)) {
        launch(meta, nb, slot_base);
        slot_base += nb;
        nb = 0;
        if (last_chunk) {
          nt = 0;
        } else {  // the current tensor continues in the next launch, as tensor 0
          set_tensor(0, t);
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) launch(meta, nb, slot_base);
}

template <typename T, int KMAX>
at::Tensor project_core_cuda(const HostLists& L, int k, double rcond, const at::TensorOptions& opts) {
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  constexpr int M = proj_num_acc(KMAX);
  int64_t nslots = 0;
  for (int64_t t = 0; t < L.T; ++t) nslots += (L.numel[t] + kChunk - 1) / kChunk;
  auto dopts = opts.dtype(at::kDouble);
  auto partials = at::empty({std::max<int64_t>(nslots, 1) * M}, dopts);
  auto coeffs = at::empty({k}, dopts);
  double* pp = partials.data_ptr<double>();
  double* cp = coeffs.data_ptr<double>();
  for_each_launch<KMAX>(L, k, [&](const TensorListMeta<KMAX>& meta, int nb, int64_t slot_base) {
    proj_pass1_kernel<T, KMAX><<<nb, kThreads, 0, stream>>>(meta, k, slot_base, pp);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  proj_finish_kernel<KMAX><<<1, kThreads, 0, stream>>>(pp, nslots, k, rcond, cp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  for_each_launch<KMAX>(L, k, [&](const TensorListMeta<KMAX>& meta, int nb, int64_t) {
    proj_pass2_kernel<T, KMAX><<<nb, kThreads, 0, stream>>>(meta, k, cp);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return coeffs;
}

at::Tensor dispatch_core_cuda(const HostLists& L, int k, double rcond, at::ScalarType dtype,
                              const at::TensorOptions& opts) {
  at::Tensor coeffs;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "project_orthogonal_cuda", [&] {
    if (k <= 2) {
      coeffs = project_core_cuda<scalar_t, 2>(L, k, rcond, opts);
    } else if (k <= 4) {
      coeffs = project_core_cuda<scalar_t, 4>(L, k, rcond, opts);
    } else {
      coeffs = project_core_cuda<scalar_t, 8>(L, k, rcond, opts);
    }
  });
  return coeffs;
}

std::tuple<at::Tensor, at::Tensor> project_orthogonal_cuda(const at::Tensor& g, const at::Tensor& basis,
                                                           double rcond) {
  const int64_t k = check_projection_flat(g, basis, rcond, "project_orthogonal");
  c10::cuda::CUDAGuard guard(g.device());
  auto out = at::empty_like(g);
  const int64_t P = g.numel();
  TORCH_CHECK_VALUE(P / kChunk < INT32_MAX, "project_orthogonal: tensor too large");
  HostLists L;
  L.T = 1;
  L.g.push_back(g.data_ptr());
  L.out.push_back(out.data_ptr());
  L.numel.push_back(P);
  const size_t row_bytes = static_cast<size_t>(P) * basis.element_size();
  for (int64_t i = 0; i < k; ++i)
    L.v.push_back(static_cast<const char*>(basis.data_ptr()) + i * row_bytes);
  auto coeffs = dispatch_core_cuda(L, static_cast<int>(k), rcond, g.scalar_type(), g.options());
  return {out, coeffs};
}

at::Tensor project_orthogonal_inplace_cuda(at::TensorList grads, at::TensorList basis, double rcond) {
  const int64_t k = check_projection_lists(grads, basis, rcond, "project_orthogonal_");
  c10::cuda::CUDAGuard guard(grads[0].device());
  HostLists L;
  L.T = static_cast<int64_t>(grads.size());
  for (int64_t t = 0; t < L.T; ++t) {
    TORCH_CHECK_VALUE(grads[t].numel() / kChunk < INT32_MAX, "project_orthogonal_: tensor too large");
    L.g.push_back(grads[t].data_ptr());
    L.out.push_back(grads[t].data_ptr());
    L.numel.push_back(grads[t].numel());
  }
  for (const auto& v : basis) L.v.push_back(v.data_ptr());
  return dispatch_core_cuda(L, static_cast<int>(k), rcond, grads[0].scalar_type(), grads[0].options());
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CUDA, m) {
  m.impl("project_orthogonal", &project_orthogonal_cuda);
  m.impl("project_orthogonal_", &project_orthogonal_inplace_cuda);
}

}  // namespace entangle_ext
