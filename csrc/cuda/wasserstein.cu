// CUDA kernels of entangle_ext::wasserstein2_1d (closed-form 1-D W2^2 by segmented stable sort).
//
// No host synchronisation anywhere (the op is CUDA-graph capturable); everything runs on the
// current stream. Two paths, chosen on the host from shapes alone (never from device values):
//  * block path, when max_seqlen <= a tier capacity (<= 2048): one thread block per segment sorts
//    the u and v segments in registers/shared memory with cub::BlockRadixSort (stable), keeps the
//    sorted values in shared memory and reduces the exact W2^2 with cub::BlockReduce.
//  * device path otherwise (long or unknown-length segments): a device-wide stable LSD radix sort
//    (cub::DeviceRadixSort, no host sync) of a composite key (segment id above order-preserving
//    value bits), then an elementwise cost kernel and a fixed-order two-level reduction.
// Both paths are deterministic (no atomics). The backward is one elementwise kernel that gathers
// the sorted neighbours and scatters through the saved stable sort permutation (a bijection).
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/cub.cuh>

#include <cstdint>
#include <limits>
#include <tuple>

#include "../common.h"
#include "../wasserstein_checks.h"

namespace entangle_ext {
namespace {

// ------------------------------------------------------------------------------------------------
// Order-preserving unsigned keys for IEEE floats. NaN is canonicalised to +NaN (sorts last, like
// torch.sort) and -0.0 to +0.0 (so that +0/-0 compare equal and keep their input order).
// ------------------------------------------------------------------------------------------------
template <typename T>
struct KeyTraits;
template <>
struct KeyTraits<float> {
  using U = uint32_t;
  __device__ static U key(float x) {
    if (x != x) x = __int_as_float(0x7fc00000);
    if (x == 0.f) x = 0.f;
    U b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
};
template <>
struct KeyTraits<double> {
  using U = unsigned long long;
  __device__ static U key(double x) {
    if (x != x) x = __longlong_as_double(0x7ff8000000000000ll);
    if (x == 0.0) x = 0.0;
    U b = static_cast<U>(__double_as_longlong(x));
    return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
  }
};

__device__ __forceinline__ void seg_bounds(const int64_t* off, int64_t s, int64_t n, int64_t* lo,
                                           int64_t* hi) {
  int64_t a = off[s];
  a = a < 0 ? 0 : (a > n ? n : a);
  int64_t b = off[s + 1];
  b = b < a ? a : (b > n ? n : b);
  *lo = a;
  *hi = b;
}

// Segment holding flat position p: the last s with off[s] <= p (clamped to [0, S-1]).
__device__ __forceinline__ int64_t find_segment(const int64_t* off, int64_t S, int64_t p) {
  int64_t lo = 0, hi = S;  // answer in [0, S-1]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) >> 1;
    if (off[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

template <typename T>
__device__ __forceinline__ T quiet_nan() { return std::numeric_limits<T>::quiet_NaN(); }

// ------------------------------------------------------------------------------------------------
// Block path: one block per segment.
// ------------------------------------------------------------------------------------------------
template <typename T, int BLOCK, int ITEMS>
struct BlockSorter {
  using K = typename KeyTraits<T>::U;
  using Sort = cub::BlockRadixSort<K, BLOCK, ITEMS, int>;
  static constexpr int CAP = BLOCK * ITEMS;

  // Stable-sorts x[lo:lo+n) (n <= CAP); writes the sorted values to sorted[0:n) (shared memory)
  // and the global source indices to perm[lo:lo+n).
  __device__ static void run(typename Sort::TempStorage& tmp, const T* x, int64_t lo, int n,
                             T* sorted, int64_t* perm) {
    K keys[ITEMS];
    int idx[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int li = threadIdx.x * ITEMS + k;
      idx[k] = li;
      keys[k] = li < n ? KeyTraits<T>::key(x[lo + li]) : ~K(0);  // padding sorts last
    }
    Sort(tmp).Sort(keys, idx);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int r = threadIdx.x * ITEMS + k;
      if (r < n) {
        perm[lo + r] = lo + idx[k];
        sorted[r] = x[lo + idx[k]];
      }
    }
  }
};

template <typename T, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
w2_block_kernel(const T* __restrict__ u, const T* __restrict__ v, const int64_t* __restrict__ uo,
                const int64_t* __restrict__ vo, int64_t Nu, int64_t Nv, T* __restrict__ out,
                int64_t* __restrict__ u_perm, int64_t* __restrict__ v_perm) {
  using acc_t = at::acc_type<T, true>;
  using BS = BlockSorter<T, BLOCK, ITEMS>;
  using Reduce = cub::BlockReduce<acc_t, BLOCK>;
  constexpr int CAP = BS::CAP;
  __shared__ union {
    typename BS::Sort::TempStorage sort;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ T sa[CAP];
  __shared__ T sb[CAP];

  const int64_t s = blockIdx.x;
  int64_t ulo, uhi, vlo, vhi;
  seg_bounds(uo, s, Nu, &ulo, &uhi);
  seg_bounds(vo, s, Nv, &vlo, &vhi);
  const int64_t na = uhi - ulo, nb = vhi - vlo;
  if (na > CAP || nb > CAP) {
    // Only reachable if the caller's max_seqlen hint was wrong: leave a valid (identity)
    // permutation and a NaN result rather than touching memory out of range.
    for (int64_t i = threadIdx.x; i < na; i += BLOCK) u_perm[ulo + i] = ulo + i;
    for (int64_t j = threadIdx.x; j < nb; j += BLOCK) v_perm[vlo + j] = vlo + j;
    if (threadIdx.x == 0) out[s] = quiet_nan<T>();
    return;
  }
  BS::run(tmp.sort, u, ulo, static_cast<int>(na), sa, u_perm);
  __syncthreads();
  BS::run(tmp.sort, v, vlo, static_cast<int>(nb), sb, v_perm);
  __syncthreads();
  if (na == 0 || nb == 0) {
    if (threadIdx.x == 0) out[s] = quiet_nan<T>();
    return;
  }
  // Drive from the larger side: each of its samples overlaps at most two of the other side.
  acc_t part = 0;
  if (na >= nb) {
    for (int64_t i = threadIdx.x; i < na; i += BLOCK) part += w2_row_cost<acc_t>(sb, i, acc_t(sa[i]), na, nb);
  } else {
    for (int64_t j = threadIdx.x; j < nb; j += BLOCK) part += w2_row_cost<acc_t>(sa, j, acc_t(sb[j]), nb, na);
  }
  const acc_t total = Reduce(tmp.reduce).Sum(part);
  if (threadIdx.x == 0) out[s] = static_cast<T>(total / (acc_t(na) * acc_t(nb)));
}

template <typename T, int BLOCK, int ITEMS>
void launch_block(const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo,
                  const at::Tensor& vo, at::Tensor& out, at::Tensor& up, at::Tensor& vp,
                  cudaStream_t stream) {
  const int64_t S = uo.numel() - 1;
  w2_block_kernel<T, BLOCK, ITEMS><<<static_cast<unsigned>(S), BLOCK, 0, stream>>>(
      u.data_ptr<T>(), v.data_ptr<T>(), uo.data_ptr<int64_t>(), vo.data_ptr<int64_t>(), u.numel(),
      v.numel(), out.data_ptr<T>(), up.data_ptr<int64_t>(), vp.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------------
// Device path: device-wide stable radix sort of (segment id, value) keys.
// ------------------------------------------------------------------------------------------------
template <typename T>
__global__ void make_keys_kernel(const T* __restrict__ x, const int64_t* __restrict__ off, int64_t S,
                                 int64_t N, typename KeyTraits<T>::U* __restrict__ vkey,
                                 uint64_t* __restrict__ skey, int64_t* __restrict__ idx,
                                 bool fuse_segment) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < N;
       p += (int64_t)gridDim.x * blockDim.x) {
    const auto k = KeyTraits<T>::key(x[p]);
    const uint64_t seg = static_cast<uint64_t>(find_segment(off, S, p));
    idx[p] = p;
    if (fuse_segment) {  // float32: one 64-bit key = segment id << 32 | value key
      skey[p] = (seg << 32) | static_cast<uint64_t>(k);
    } else {
      vkey[p] = k;
      if (skey) skey[p] = seg;
    }
  }
}

__global__ void gather_segment_kernel(const int64_t* __restrict__ off, int64_t S, int64_t N,
                                      const int64_t* __restrict__ idx, uint64_t* __restrict__ skey) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < N;
       p += (int64_t)gridDim.x * blockDim.x)
    skey[p] = static_cast<uint64_t>(find_segment(off, S, idx[p]));
}

int bits_for(int64_t S) {
  int b = 1;
  while (b < 63 && (int64_t(1) << b) < S) ++b;
  return b;
}

inline unsigned grid_for(int64_t n, int block) {
  const int64_t g = (n + block - 1) / block;
  const int64_t cap = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(g, cap)));
}

// Stable segmented argsort of x (flat, N) by radix sort; writes global source indices to perm.
template <typename T>
void device_argsort(const at::Tensor& x, const at::Tensor& off, at::Tensor& perm, cudaStream_t stream) {
  using K = typename KeyTraits<T>::U;
  const int64_t N = x.numel();
  const int64_t S = off.numel() - 1;
  if (N == 0) return;
  auto opts = x.options();
  const int sbits = S > 1 ? bits_for(S) : 0;
  // One segment: a plain 32/64-bit value sort. float32 with several segments: one pass over
  // 64-bit (segment id << 32 | value) keys. Otherwise: value pass, then a stable segment-id pass.
  const bool fuse = S > 1 && (sizeof(K) == 4) && sbits <= 32;
  auto idx = at::empty({N}, opts.dtype(at::kLong));
  constexpr int B = 256;
  const unsigned G = grid_for(N, B);
  auto u64 = opts.dtype(at::kLong);  // storage for uint64 keys
  if (fuse) {
    auto skey_in = at::empty({N}, u64), skey_out = at::empty({N}, u64);
    make_keys_kernel<T><<<G, B, 0, stream>>>(x.data_ptr<T>(), off.data_ptr<int64_t>(), S, N, nullptr,
                                             reinterpret_cast<uint64_t*>(skey_in.data_ptr<int64_t>()),
                                             idx.data_ptr<int64_t>(), true);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    size_t bytes = 0;
    auto* kin = reinterpret_cast<uint64_t*>(skey_in.data_ptr<int64_t>());
    auto* kout = reinterpret_cast<uint64_t*>(skey_out.data_ptr<int64_t>());
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, kin, kout, idx.data_ptr<int64_t>(),
                                                   perm.data_ptr<int64_t>(), N, 0, 32 + sbits, stream));
    auto temp = at::empty({static_cast<int64_t>(bytes)}, opts.dtype(at::kByte));
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, kin, kout, idx.data_ptr<int64_t>(),
                                                   perm.data_ptr<int64_t>(), N, 0, 32 + sbits, stream));
    return;
  }
  // Two stable passes: by value key, then (if several segments) by segment id.
  auto vk_in = at::empty({N}, sizeof(K) == 4 ? opts.dtype(at::kInt) : u64);
  auto vk_out = at::empty_like(vk_in);
  make_keys_kernel<T><<<G, B, 0, stream>>>(x.data_ptr<T>(), off.data_ptr<int64_t>(), S, N,
                                           reinterpret_cast<K*>(vk_in.data_ptr()), nullptr,
                                           idx.data_ptr<int64_t>(), false);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto* kin = reinterpret_cast<K*>(vk_in.data_ptr());
  auto* kout = reinterpret_cast<K*>(vk_out.data_ptr());
  at::Tensor by_value = S > 1 ? at::empty({N}, opts.dtype(at::kLong)) : perm;
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, kin, kout, idx.data_ptr<int64_t>(),
                                                 by_value.data_ptr<int64_t>(), N, 0, int(sizeof(K) * 8), stream));
  auto temp = at::empty({static_cast<int64_t>(bytes)}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, kin, kout, idx.data_ptr<int64_t>(),
                                                 by_value.data_ptr<int64_t>(), N, 0, int(sizeof(K) * 8), stream));
  if (S <= 1) return;
  auto sk_in = at::empty({N}, u64), sk_out = at::empty({N}, u64);
  auto* sin = reinterpret_cast<uint64_t*>(sk_in.data_ptr<int64_t>());
  auto* sout = reinterpret_cast<uint64_t*>(sk_out.data_ptr<int64_t>());
  gather_segment_kernel<<<G, B, 0, stream>>>(off.data_ptr<int64_t>(), S, N, by_value.data_ptr<int64_t>(), sin);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  size_t bytes2 = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes2, sin, sout, by_value.data_ptr<int64_t>(),
                                                 perm.data_ptr<int64_t>(), N, 0, sbits, stream));
  auto temp2 = at::empty({static_cast<int64_t>(bytes2)}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp2.data_ptr(), bytes2, sin, sout, by_value.data_ptr<int64_t>(),
                                                 perm.data_ptr<int64_t>(), N, 0, sbits, stream));
}

// One sorted position q of the flat [u positions | v positions] layout, seen from its own side.
struct SidePos {
  bool valid;                 // q lies inside its segment and its source index is in range
  int64_t seg;                // segment id
  int64_t i, src;             // rank inside the segment, global source index (through the perm)
  int64_t n_self, n_other;    // segment sizes of this side and of the other side
  int64_t other_lo;           // first flat position of the segment on the other side
};

__device__ __forceinline__ SidePos side_position(int64_t p, const int64_t* uo, const int64_t* vo,
                                                 int64_t S, int64_t Nu, int64_t Nv,
                                                 const int64_t* up, const int64_t* vp) {
  const bool on_u = p < Nu;
  const int64_t q = on_u ? p : p - Nu;
  const int64_t s = find_segment(on_u ? uo : vo, S, q);
  int64_t ulo, uhi, vlo, vhi;
  seg_bounds(uo, s, Nu, &ulo, &uhi);
  seg_bounds(vo, s, Nv, &vlo, &vhi);
  SidePos r;
  r.seg = s;
  const int64_t lo = on_u ? ulo : vlo, hi = on_u ? uhi : vhi, N = on_u ? Nu : Nv;
  r.n_self = hi - lo;
  r.n_other = on_u ? vhi - vlo : uhi - ulo;
  r.other_lo = on_u ? vlo : ulo;
  r.i = q - lo;
  r.src = (q >= lo && q < hi) ? (on_u ? up : vp)[q] : -1;
  r.valid = r.src >= 0 && r.src < N && r.n_other > 0;  // malformed offsets: stay in bounds
  return r;
}

// sum_j w_ij (x - b_j)^POW over the samples b_j of the other side that overlap sample i (POW = 2:
// the W2^2 cost of sample i; POW = 1: (n_self n_other / 2) d W2^2 / d x), reading b through its
// sort permutation.
template <int POW, typename T, typename acc_t>
__device__ __forceinline__ acc_t overlap_sum(const SidePos& r, acc_t x, const T* other,
                                             const int64_t* other_perm, int64_t N_other) {
  if (r.n_self == r.n_other) {  // equal sizes: rank pairing, w_ii = n (no 64-bit divisions)
    const int64_t sj = other_perm[r.other_lo + r.i];
    const acc_t d = x - ((sj >= 0 && sj < N_other) ? acc_t(other[sj]) : acc_t(0));
    return acc_t(r.n_self) * (POW == 2 ? d * d : d);
  }
  int64_t j_lo, j_hi;
  overlap_range(r.i, r.n_self, r.n_other, &j_lo, &j_hi);
  acc_t acc = 0;
  for (int64_t j = j_lo; j <= j_hi; ++j) {
    const int64_t sj = other_perm[r.other_lo + j];
    const acc_t d = x - ((sj >= 0 && sj < N_other) ? acc_t(other[sj]) : acc_t(0));
    acc += acc_t(overlap_weight(r.i, j, r.n_self, r.n_other)) * (POW == 2 ? d * d : d);
  }
  return acc;
}

// Per sorted position of the driving (larger) side of its segment: sum_j w_ij (a_i - b_j)^2, so
// that every overlapping pair is counted once (u drives ties). Other positions contribute 0.
// Layout: [u positions | v positions].
template <typename T, typename acc_t>
__global__ void w2_cost_kernel(const T* __restrict__ u, const T* __restrict__ v,
                               const int64_t* __restrict__ uo, const int64_t* __restrict__ vo,
                               int64_t S, int64_t Nu, int64_t Nv, const int64_t* __restrict__ up,
                               const int64_t* __restrict__ vp, acc_t* __restrict__ cost) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < Nu + Nv;
       p += (int64_t)gridDim.x * blockDim.x) {
    const bool on_u = p < Nu;
    const SidePos r = side_position(p, uo, vo, S, Nu, Nv, up, vp);
    const bool drives = on_u ? r.n_self >= r.n_other : r.n_self > r.n_other;
    acc_t c = 0;
    if (r.valid && drives) {
      c = on_u ? overlap_sum<2>(r, acc_t(u[r.src]), v, vp, Nv)
               : overlap_sum<2>(r, acc_t(v[r.src]), u, up, Nu);
    }
    cost[p] = c;
  }
}

// Level 1: block (s, c) sums chunk c of segment s (both sides) into partial[s * C + c].
// Summed in float64 whatever acc_t is: C comes from the mean segment length, so one long segment
// among many short ones is summed by a single block (tens of thousands of sequential adds per
// thread), where a float32 running sum drifts past 1e-4 relative to the CPU (float64) result.
template <typename acc_t, int BLOCK>
__global__ void segment_partial_kernel(const acc_t* __restrict__ cost, const int64_t* __restrict__ uo,
                                       const int64_t* __restrict__ vo, int64_t Nu, int64_t Nv,
                                       double* __restrict__ partial) {
  using Reduce = cub::BlockReduce<double, BLOCK>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t s = blockIdx.x, C = gridDim.y, c = blockIdx.y;
  int64_t ulo, uhi, vlo, vhi;
  seg_bounds(uo, s, Nu, &ulo, &uhi);
  seg_bounds(vo, s, Nv, &vlo, &vhi);
  double part = 0;
  const int64_t na = uhi - ulo, nb = vhi - vlo;
  const int64_t cu = (na + C - 1) / C, cv = (nb + C - 1) / C;
  for (int64_t k = threadIdx.x; k < cu; k += BLOCK) {
    const int64_t i = c * cu + k;
    if (i < na) part += static_cast<double>(cost[ulo + i]);
  }
  for (int64_t k = threadIdx.x; k < cv; k += BLOCK) {
    const int64_t j = c * cv + k;
    if (j < nb) part += static_cast<double>(cost[Nu + vlo + j]);
  }
  const double total = Reduce(tmp).Sum(part);
  if (threadIdx.x == 0) partial[s * C + c] = total;
}

// Level 2: out[s] = sum_c partial[s, c] / (na * nb), in a fixed order.
template <typename T>
__global__ void segment_finish_kernel(const double* __restrict__ partial, int64_t C,
                                      const int64_t* __restrict__ uo, const int64_t* __restrict__ vo,
                                      int64_t S, int64_t Nu, int64_t Nv, T* __restrict__ out) {
  for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s < S;
       s += (int64_t)gridDim.x * blockDim.x) {
    int64_t ulo, uhi, vlo, vhi;
    seg_bounds(uo, s, Nu, &ulo, &uhi);
    seg_bounds(vo, s, Nv, &vlo, &vhi);
    const int64_t na = uhi - ulo, nb = vhi - vlo;
    if (na == 0 || nb == 0) { out[s] = quiet_nan<T>(); continue; }
    double t = 0;
    for (int64_t c = 0; c < C; ++c) t += partial[s * C + c];
    out[s] = static_cast<T>(t / (double(na) * double(nb)));
  }
}

template <typename T>
void launch_device_path(const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo,
                        const at::Tensor& vo, at::Tensor& out, at::Tensor& up, at::Tensor& vp,
                        cudaStream_t stream) {
  using acc_t = at::acc_type<T, true>;
  const int64_t S = uo.numel() - 1, Nu = u.numel(), Nv = v.numel();
  device_argsort<T>(u, uo, up, stream);
  device_argsort<T>(v, vo, vp, stream);
  auto acc_opts = u.options().dtype(c10::CppTypeToScalarType<acc_t>::value);
  auto cost = at::empty({std::max<int64_t>(Nu + Nv, 1)}, acc_opts);
  constexpr int B = 256;
  if (Nu + Nv > 0) {
    w2_cost_kernel<T, acc_t><<<grid_for(Nu + Nv, B), B, 0, stream>>>(
        u.data_ptr<T>(), v.data_ptr<T>(), uo.data_ptr<int64_t>(), vo.data_ptr<int64_t>(), S, Nu, Nv,
        up.data_ptr<int64_t>(), vp.data_ptr<int64_t>(), static_cast<acc_t*>(cost.data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // Chunks per segment from the mean segment length (shapes only; correctness does not depend on it).
  const int64_t mean_len = (std::max(Nu, Nv) + S - 1) / S;
  const int64_t C = std::max<int64_t>(1, std::min<int64_t>(64, mean_len / 4096));
  auto partial = at::empty({S * C}, u.options().dtype(at::kDouble));
  segment_partial_kernel<acc_t, B><<<dim3(static_cast<unsigned>(S), static_cast<unsigned>(C)), B, 0, stream>>>(
      static_cast<acc_t*>(cost.data_ptr()), uo.data_ptr<int64_t>(), vo.data_ptr<int64_t>(), Nu, Nv,
      partial.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  segment_finish_kernel<T><<<grid_for(S, B), B, 0, stream>>>(
      partial.data_ptr<double>(), C, uo.data_ptr<int64_t>(), vo.data_ptr<int64_t>(), S, Nu, Nv,
      out.data_ptr<T>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> w2_forward_cuda(const at::Tensor& u, const at::Tensor& v,
                                                                const at::Tensor& u_offsets,
                                                                const at::Tensor& v_offsets,
                                                                int64_t max_seqlen) {
  check_w2_inputs(u, v, u_offsets, v_offsets, "wasserstein2_1d");
  c10::cuda::CUDAGuard guard(u.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t S = u_offsets.numel() - 1;
  auto out = at::empty({S}, u.options());
  auto up = at::empty({u.numel()}, u.options().dtype(at::kLong));
  auto vp = at::empty({v.numel()}, v.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "wasserstein2_1d_cuda", [&] {
    const bool is_f32 = std::is_same<scalar_t, float>::value;
    const bool fits_grid = S <= 2147483647LL;
    TORCH_CHECK_VALUE(fits_grid, "wasserstein2_1d: at most 2^31-1 segments per call on CUDA");
    if (max_seqlen >= 0 && max_seqlen <= 128 && fits_grid) {
      launch_block<scalar_t, 64, 2>(u, v, u_offsets, v_offsets, out, up, vp, stream);
    } else if (max_seqlen >= 0 && max_seqlen <= 512 && fits_grid) {
      launch_block<scalar_t, 128, 4>(u, v, u_offsets, v_offsets, out, up, vp, stream);
    } else if (max_seqlen >= 0 && max_seqlen <= 1024 && fits_grid) {
      launch_block<scalar_t, 256, 4>(u, v, u_offsets, v_offsets, out, up, vp, stream);
    } else if (is_f32 && max_seqlen >= 0 && max_seqlen <= 2048 && fits_grid) {
      // float32 only: the float64 variant would exceed the 48 KiB static shared-memory limit.
      if constexpr (std::is_same<scalar_t, float>::value)
        launch_block<scalar_t, 256, 8>(u, v, u_offsets, v_offsets, out, up, vp, stream);
    } else {
      launch_device_path<scalar_t>(u, v, u_offsets, v_offsets, out, up, vp, stream);
    }
  });
  return {out, up, vp};
}

// ------------------------------------------------------------------------------------------------
// Backward: one thread per sorted position of u and v.
// ------------------------------------------------------------------------------------------------
template <typename T, typename acc_t>
__global__ void w2_backward_kernel(const T* __restrict__ grad, const T* __restrict__ u,
                                   const T* __restrict__ v, const int64_t* __restrict__ uo,
                                   const int64_t* __restrict__ vo, int64_t S, int64_t Nu, int64_t Nv,
                                   const int64_t* __restrict__ up, const int64_t* __restrict__ vp,
                                   T* __restrict__ gu, T* __restrict__ gv) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < Nu + Nv;
       p += (int64_t)gridDim.x * blockDim.x) {
    const bool on_u = p < Nu;
    const SidePos r = side_position(p, uo, vo, S, Nu, Nv, up, vp);
    if (!r.valid) continue;  // empty segment (undefined value, zero gradient) or out of range
    const acc_t scale = acc_t(2) * acc_t(grad[r.seg]) / (acc_t(r.n_self) * acc_t(r.n_other));
    // d W2^2 / d x_(i) = 2 sum_j w_ij (x_(i) - y_(j)) / (n_x n_y), for x = u (y = v) and x = v.
    if (on_u) gu[r.src] = static_cast<T>(scale * overlap_sum<1>(r, acc_t(u[r.src]), v, vp, Nv));
    else      gv[r.src] = static_cast<T>(scale * overlap_sum<1>(r, acc_t(v[r.src]), u, up, Nu));
  }
}

std::tuple<at::Tensor, at::Tensor> w2_backward_cuda(const at::Tensor& grad, const at::Tensor& u,
                                                    const at::Tensor& v, const at::Tensor& u_offsets,
                                                    const at::Tensor& v_offsets, const at::Tensor& u_perm,
                                                    const at::Tensor& v_perm) {
  check_w2_backward_inputs(grad, u, v, u_offsets, v_offsets, u_perm, v_perm);
  c10::cuda::CUDAGuard guard(u.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto gu = at::zeros_like(u);
  auto gv = at::zeros_like(v);
  const int64_t S = u_offsets.numel() - 1, Nu = u.numel(), Nv = v.numel();
  if (Nu + Nv == 0) return {gu, gv};
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "wasserstein2_1d_backward_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    constexpr int B = 256;
    w2_backward_kernel<scalar_t, acc_t><<<grid_for(Nu + Nv, B), B, 0, stream>>>(
        grad.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
        u_offsets.data_ptr<int64_t>(), v_offsets.data_ptr<int64_t>(), S, Nu, Nv,
        u_perm.data_ptr<int64_t>(), v_perm.data_ptr<int64_t>(), gu.data_ptr<scalar_t>(),
        gv.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {gu, gv};
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CUDA, m) {
  m.impl("wasserstein2_1d", &w2_forward_cuda);
  m.impl("wasserstein2_1d_backward", &w2_backward_cuda);
}

}  // namespace entangle_ext
