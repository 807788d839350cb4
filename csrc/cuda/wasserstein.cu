// CUDA kernels of entangle_ext::wasserstein2_1d (closed-form 1-D W2^2 by segmented stable sort).
//
// No host synchronisation unless validate=True (graph capturable); everything runs on the current
// stream, deterministically (fixed reduction orders, no atomics). Two forward paths, chosen on the
// host from shapes and the max_seqlen hint only:
//  * block path (every segment <= a tier capacity <= 2048): one thread block per segment sorts
//    both sides in shared memory (cub::BlockRadixSort, stable), then the larger side's ranks
//    evaluate the shared terms of csrc/wasserstein.h: cost by cub::BlockReduce, the smaller
//    side's runs R_j by a block-wide segmented scan. A segment above the capacity (a max_seqlen
//    hint that was too small, validate=False) gets NaN and zero gradients, never a wrong access.
//  * device path otherwise (csrc/cuda/wasserstein_device_path.cuh).
// Both write dW2^2/dx for the sides that need it; the backward is one elementwise kernel.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/cub.cuh>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

#include "../wasserstein.h"
#include "wasserstein_device_path.cuh"

namespace entangle_ext {
namespace w2 {
namespace cuda {
namespace {

constexpr const char* kOp = "wasserstein2_1d";

template <typename T>
__device__ __forceinline__ T nan_of() { return static_cast<T>(from_bits(KeyOf<T>::kNaN)); }

template <typename T>
__device__ __forceinline__ void zero_range(T* g, int64_t lo, int64_t n) {
  if (g)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) g[lo + i] = T(0);
}

// ------------------------------------------------------------------------------------------------
// Block path: one block per segment.
// ------------------------------------------------------------------------------------------------
template <typename T, int BLOCK, int ITEMS>
struct BlockPath {
  using K = typename KeyOf<T>::type;
  static constexpr int kCap = BLOCK * ITEMS;
  using Sort = cub::BlockRadixSort<K, BLOCK, ITEMS, int>;
  using Reduce = cub::BlockReduce<acc_t, BLOCK>;
  using Scan = cub::BlockScan<RunSum, BLOCK>;
  struct Shared {
    union {
      typename Sort::TempStorage sort;
      typename Reduce::TempStorage reduce;
      typename Scan::TempStorage scan;
    } tmp;
    T vals[2][kCap];             // sorted u, sorted v
    uint16_t perm[2][kCap];      // local source index of each sorted rank
  };

  // Stable-sorts x[lo : lo + n) (n <= kCap) into vals/perm.
  __device__ static void sort(Shared& sh, int side, const T* x, int64_t lo, int n) {
    K keys[ITEMS];
    int idx[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int r = threadIdx.x * ITEMS + k;
      idx[k] = r;
      keys[k] = r < n ? sort_key(x[lo + r]) : ~K(0);  // padding sorts last
    }
    Sort(sh.tmp.sort).Sort(keys, idx);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int r = threadIdx.x * ITEMS + k;
      if (r < n) {
        sh.vals[side][r] = key_value<T>(keys[k]);
        sh.perm[side][r] = static_cast<uint16_t>(idx[k]);
      }
    }
  }
};

template <typename T, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
w2_block_kernel(const T* __restrict__ u, const T* __restrict__ v, const int64_t* __restrict__ uo,
                const int64_t* __restrict__ vo, int64_t Nu, int64_t Nv, T* __restrict__ out,
                T* __restrict__ du, T* __restrict__ dv) {
  using P = BlockPath<T, BLOCK, ITEMS>;
  __shared__ typename P::Shared sh;
  const int64_t s = blockIdx.x;
  int64_t ulo, uhi, vlo, vhi;
  segment_bounds(uo, s, Nu, &ulo, &uhi);
  segment_bounds(vo, s, Nv, &vlo, &vhi);
  const int64_t na = uhi - ulo, nb = vhi - vlo;
  if (na > P::kCap || nb > P::kCap || na == 0 || nb == 0) {
    // Empty side (W2 undefined) or above capacity (max_seqlen hint too small): NaN, zero gradient.
    if (threadIdx.x == 0) out[s] = nan_of<T>();
    zero_range(du, ulo, na);
    zero_range(dv, vlo, nb);
    return;
  }
  P::sort(sh, 0, u, ulo, static_cast<int>(na));
  __syncthreads();
  P::sort(sh, 1, v, vlo, static_cast<int>(nb));
  __syncthreads();
  const bool u_larger = na >= nb;  // the larger side drives (u on ties)
  const int L = u_larger ? 0 : 1;
  const int64_t nL = u_larger ? na : nb, nS = u_larger ? nb : na;
  const int64_t loL = u_larger ? ulo : vlo, loS = u_larger ? vlo : ulo;
  T* gL = u_larger ? du : dv;
  T* gS = u_larger ? dv : du;
  const acc_t scale = grad_scale(nL, nS);
  const T* lv = sh.vals[L];
  const T* sv = sh.vals[1 - L];
  const uint16_t* lp = sh.perm[L];
  const uint16_t* sp = sh.perm[1 - L];
  acc_t cost = 0;
  RunSum run[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = int64_t(threadIdx.x) * ITEMS + k;
    run[k] = RunSum{1, 0};
    if (i >= nL) continue;
    const LargerTerms tm = larger_terms(static_cast<acc_t>(lv[i]), sv, i, nL, nS);
    cost += tm.cost;
    if (gL) gL[loL + lp[i]] = static_cast<T>(scale * tm.grad);
    int64_t j, unused, run_lo, run_hi;
    overlap_range(i, nL, nS, &j, &unused);
    first_overlap_run(j, nL, nS, &run_lo, &run_hi);
    run[k] = RunSum{i == run_lo, tm.first};
  }
  const acc_t total = typename P::Reduce(sh.tmp.reduce).Sum(cost);
  if (threadIdx.x == 0) out[s] = static_cast<T>(w2_of_cost(total, nL, nS));
  if (!gS) return;
  __syncthreads();  // tmp.reduce -> tmp.scan
  typename P::Scan(sh.tmp.scan).InclusiveScan(run, run, RunSumOp());
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = int64_t(threadIdx.x) * ITEMS + k;
    if (i >= nL) continue;
    int64_t j, unused, run_lo, run_hi;
    overlap_range(i, nL, nS, &j, &unused);
    first_overlap_run(j, nL, nS, &run_lo, &run_hi);
    if (i + 1 != run_hi) continue;  // the run of smaller-side sample j ends here
    const acc_t g = run[k].v + smaller_spill(static_cast<acc_t>(sv[j]), lv, j, nL, nS);
    gS[loS + sp[j]] = static_cast<T>(scale * g);
  }
}

template <typename T, int BLOCK, int ITEMS>
void launch_block(const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo, const at::Tensor& vo,
                  at::Tensor& out, T* du, T* dv, cudaStream_t stream) {
  const int64_t S = uo.numel() - 1;
  w2_block_kernel<T, BLOCK, ITEMS><<<static_cast<unsigned>(S), BLOCK, 0, stream>>>(
      u.data_ptr<T>(), v.data_ptr<T>(), uo.data_ptr<int64_t>(), vo.data_ptr<int64_t>(), u.numel(),
      v.numel(), out.data_ptr<T>(), du, dv);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The block tier for segments of at most `longest` values (-1: unknown), or 0 for the device path.
template <typename T>
int block_tier(int64_t longest, int64_t S) {
  if (longest < 0 || S > 2147483647LL) return 0;
  if (longest <= 128) return 1;
  if (longest <= 512) return 2;
  if (longest <= 1024) return 3;
  // float64 at 2048 would exceed the 48 KiB of static shared memory.
  return (sizeof(T) == 4 && longest <= 2048) ? 4 : 0;
}

// validate=True: host copies of the offsets (one sync) and a finiteness check of the values.
int64_t validate_on_host(const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo,
                         const at::Tensor& vo, int64_t max_seqlen) {
  const int64_t S = uo.numel() - 1;
  const at::Tensor uo_h = uo.cpu(), vo_h = vo.cpu();
  const int64_t lu = check_w2_offsets_values(uo_h.data_ptr<int64_t>(), S, u.numel(), "u_offsets", "u", kOp);
  const int64_t lv = check_w2_offsets_values(vo_h.data_ptr<int64_t>(), S, v.numel(), "v_offsets", "v", kOp);
  check_w2_max_seqlen(max_seqlen, std::max(lu, lv), kOp);
  const at::Tensor finite = at::stack({at::isfinite(u).all(), at::isfinite(v).all()}).cpu();
  check_w2_finite(finite[0].item<bool>(), "u", kOp);
  check_w2_finite(finite[1].item<bool>(), "v", kOp);
  return std::max(lu, lv);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> w2_forward_cuda(
    const at::Tensor& u, const at::Tensor& v, const at::Tensor& u_offsets,
    const at::Tensor& v_offsets, int64_t max_seqlen, bool grad_u, bool grad_v, bool validate) {
  check_w2_inputs(u, v, u_offsets, v_offsets, kOp);
  c10::cuda::CUDAGuard guard(u.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t S = u_offsets.numel() - 1;
  const int64_t longest = validate ? validate_on_host(u, v, u_offsets, v_offsets, max_seqlen) : -1;
  const int64_t bound = max_seqlen >= 0 ? max_seqlen : longest;
  auto out = at::empty({S}, u.options());
  auto du = grad_u ? at::empty_like(u) : at::empty({0}, u.options());
  auto dv = grad_v ? at::empty_like(v) : at::empty({0}, v.options());
  if (S == 0) {
    if (grad_u) du.zero_();
    if (grad_v) dv.zero_();
    return {out, du, dv};
  }
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "wasserstein2_1d_cuda", [&] {
    scalar_t* dup = grad_u ? du.data_ptr<scalar_t>() : nullptr;
    scalar_t* dvp = grad_v ? dv.data_ptr<scalar_t>() : nullptr;
    const int tier = block_tier<scalar_t>(bound, S);
    if (tier > 0 && !validate) {  // unvalidated offsets may leave values in no segment: gradient 0
      if (grad_u) du.zero_();
      if (grad_v) dv.zero_();
    }
    if (tier == 1) launch_block<scalar_t, 64, 2>(u, v, u_offsets, v_offsets, out, dup, dvp, stream);
    else if (tier == 2) launch_block<scalar_t, 128, 4>(u, v, u_offsets, v_offsets, out, dup, dvp, stream);
    else if (tier == 3) launch_block<scalar_t, 256, 4>(u, v, u_offsets, v_offsets, out, dup, dvp, stream);
    else if (tier == 4) {
      if constexpr (sizeof(scalar_t) == 4)
        launch_block<scalar_t, 256, 8>(u, v, u_offsets, v_offsets, out, dup, dvp, stream);
    } else if (std::max(u.numel(), v.numel()) <= 2147483647LL) {
      launch_device_path<scalar_t, int32_t>(u, v, u_offsets, v_offsets, out, dup, dvp, stream);
    } else {
      launch_device_path<scalar_t, int64_t>(u, v, u_offsets, v_offsets, out, dup, dvp, stream);
    }
  });
  return {out, du, dv};
}

// ------------------------------------------------------------------------------------------------
// Backward: grad_x[p] = grad[s] * dx[p] for the segment s = find_segment(p) (0 outside its bounds).
// ------------------------------------------------------------------------------------------------
template <typename T>
__global__ void w2_backward_kernel(const T* __restrict__ grad, const T* __restrict__ dx,
                                   const int64_t* __restrict__ off, int64_t S, int64_t N, T* __restrict__ gx) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < N; p += int64_t(gridDim.x) * blockDim.x) {
    T g = T(0);
    if (S > 0) {
      int64_t lo, hi;
      const int64_t s = find_segment(off, S, p);
      segment_bounds(off, s, N, &lo, &hi);
      if (p >= lo && p < hi) g = grad[s] * dx[p];
    }
    gx[p] = g;
  }
}

std::tuple<at::Tensor, at::Tensor> w2_backward_cuda(const at::Tensor& grad, const at::Tensor& du,
                                                    const at::Tensor& dv, const at::Tensor& u_offsets,
                                                    const at::Tensor& v_offsets) {
  check_w2_backward_inputs(grad, du, dv, u_offsets, v_offsets);
  c10::cuda::CUDAGuard guard(grad.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t S = u_offsets.numel() - 1;
  auto gu = at::empty_like(du), gv = at::empty_like(dv);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "wasserstein2_1d_backward_cuda", [&] {
    const std::pair<const at::Tensor*, at::Tensor*> sides[2] = {{&du, &gu}, {&dv, &gv}};
    const at::Tensor* offs[2] = {&u_offsets, &v_offsets};
    for (int k = 0; k < 2; ++k) {
      const int64_t N = sides[k].first->numel();
      if (N == 0) continue;
      w2_backward_kernel<scalar_t><<<grid_for(N, 256), 256, 0, stream>>>(
          grad.data_ptr<scalar_t>(), sides[k].first->data_ptr<scalar_t>(), offs[k]->data_ptr<int64_t>(),
          S, N, sides[k].second->data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {gu, gv};
}

}  // namespace
}  // namespace cuda
}  // namespace w2

TORCH_LIBRARY_IMPL(entangle_ext, CUDA, m) {
  m.impl("wasserstein2_1d", &w2::cuda::w2_forward_cuda);
  m.impl("wasserstein2_1d_backward", &w2::cuda::w2_backward_cuda);
}

}  // namespace entangle_ext
