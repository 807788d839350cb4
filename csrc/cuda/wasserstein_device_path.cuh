// Device path of the CUDA wasserstein2_1d forward (segments of any length, no host sync):
//  1. a stable device-wide radix sort per side (cub::DeviceRadixSort on cub::DoubleBuffer; keys =
//     segment id above the order-preserving value bits; int32 payload when the side fits),
//  2. w2_tile_kernel: one block per tile of kTile sorted positions of each side. Larger-side
//     positions evaluate their terms (csrc/wasserstein.h), write their own gradient, and sum the
//     segment cost and the smaller side's runs R_j with two block-wide segmented scans (fixed
//     tree order); each piece is FINAL or goes to a tail/head slot of its tile,
//  3. w2_combine_kernel: one thread per tile finishes the runs that cross tiles (combine_pieces),
//  4. w2_finish_kernel: W2^2 per segment from its cost (NaN for an empty side).
// Work and order depend on the total length only, not on the mix of segment lengths; no atomics.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <cub/cub.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "../wasserstein.h"

namespace entangle_ext {
namespace w2 {
namespace cuda {

inline unsigned grid_for(int64_t n, int block) {
  const int64_t g = (n + block - 1) / block;
  const int64_t cap = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(g, cap)));
}

// A segmented-sum scan item: head marks the first item of a run.
struct RunSum {
  int head;
  acc_t v;
};
struct RunSumOp {
  __device__ __forceinline__ RunSum operator()(const RunSum& a, const RunSum& b) const {
    return {a.head | b.head, b.head ? b.v : a.v + b.v};
  }
};

// One side after the device sort. Sorted values come from the sorted keys when they hold them
// (float32 always; float64 with one segment), else from a gather x[perm[q]].
template <typename T, typename I>
struct SortedSide {
  const T* x;
  const uint64_t* keys64;  // sorted 64-bit keys (float32: segment << 32 | key; float64: key), or null
  const uint32_t* keys32;  // sorted 32-bit keys (float32, one segment), or null
  const I* perm;           // global source index of each sorted position
  const int64_t* off;
  int64_t N;
  T* grad;                 // dW2/dx of this side, or null

  __device__ __forceinline__ T value(int64_t q) const {
    if (keys32) return key_value<float>(keys32[q]);
    if (keys64) {
      if (sizeof(T) == 4) return static_cast<T>(key_value<float>(static_cast<uint32_t>(keys64[q])));
      return static_cast<T>(key_value<double>(keys64[q]));
    }
    return x[perm[q]];
  }
};

// The values of one sorted segment, indexable from 0 (the Seq of csrc/wasserstein.h).
template <typename T, typename I>
struct SegmentValues {
  const SortedSide<T, I>* side;
  int64_t lo;
  __device__ __forceinline__ T operator[](int64_t j) const { return side->value(lo + j); }
};

// Where sorted position q of a side lies: its segment, the bounds on both sides, and whether it
// drives its segment (larger side; u on ties). Malformed offsets: `inside` false, no contribution.
struct Where {
  int64_t s, lo, hi, olo, ohi;
  bool inside, drives;
};

template <typename T, typename I>
__device__ __forceinline__ Where locate(const SortedSide<T, I>& me, const SortedSide<T, I>& other,
                                        bool is_u, int64_t s, int64_t q) {
  Where w;
  w.s = s;
  segment_bounds(me.off, s, me.N, &w.lo, &w.hi);
  segment_bounds(other.off, s, other.N, &w.olo, &w.ohi);
  const int64_t n = w.hi - w.lo, m = w.ohi - w.olo;
  w.inside = q >= w.lo && q < w.hi && m > 0;
  w.drives = w.inside && (is_u ? n >= m : n > m);
  return w;
}

// The segment of sorted position q: find_segment, or (offsets known to partition [0, N)) a walk
// on from the segment s of position q-1, which gives the same answer.
__device__ __forceinline__ int64_t segment_of(const int64_t* off, int64_t S, bool tidy, int64_t s, int64_t q) {
  if (s < 0 || !tidy) return find_segment(off, S, q);
  while (s + 1 < S && off[s + 1] <= q) ++s;
  return s;
}

// Slots of the tiled sums, per side: [cost tail | cost head | run tail | run head], each tiles long.
struct TileSlots {
  acc_t* base;
  int64_t tiles;
  __device__ __forceinline__ acc_t* cost_tail() const { return base; }
  __device__ __forceinline__ acc_t* cost_head() const { return base + tiles; }
  __device__ __forceinline__ acc_t* run_tail() const { return base + 2 * tiles; }
  __device__ __forceinline__ acc_t* run_head() const { return base + 3 * tiles; }
};

template <typename T, typename I>
struct TileParams {
  SortedSide<T, I> side[2];  // u, v
  TileSlots slots[2];
  const int* tidy;           // (2,) 1 when u_offsets (resp. v_offsets) partition [0, N)
  int64_t S;
  acc_t* cost;               // (S,) cost sum per segment (its larger side's run)
};

// The smaller-side sample j of segment w gets its gradient from its run total.
template <typename T, typename I>
__device__ __forceinline__ void finish_smaller(const SortedSide<T, I>& me, const SortedSide<T, I>& other,
                                               const Where& w, int64_t j, acc_t run_total) {
  if (!other.grad) return;
  const int64_t nL = w.hi - w.lo, nS = w.ohi - w.olo;
  const SegmentValues<T, I> l{&me, w.lo};
  const acc_t g = run_total + smaller_spill(static_cast<acc_t>(other.value(w.olo + j)), l, j, nL, nS);
  other.grad[other.perm[w.olo + j]] = static_cast<T>(grad_scale(nL, nS) * g);
}

template <typename T, typename I, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK) w2_tile_kernel(TileParams<T, I> p, int64_t tiles_u) {
  static_assert(BLOCK * ITEMS == kTile, "one block per tile");
  using Scan = cub::BlockScan<RunSum, BLOCK>;
  __shared__ typename Scan::TempStorage scan_tmp;
  const int side = blockIdx.x < tiles_u ? 0 : 1;
  const int64_t t = side == 0 ? blockIdx.x : blockIdx.x - tiles_u;
  const SortedSide<T, I>& me = p.side[side];
  const SortedSide<T, I>& other = p.side[1 - side];
  const bool tidy = p.tidy[side] != 0;
  const int64_t q0 = t * kTile + int64_t(threadIdx.x) * ITEMS;  // blocked: ITEMS consecutive positions
  RunSum cost[ITEMS], run[ITEMS];
  int64_t s = -1;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t q = q0 + k;
    cost[k] = run[k] = RunSum{1, 0};
    if (q >= me.N) continue;
    s = segment_of(me.off, p.S, tidy, s, q);
    const Where w = locate(me, other, side == 0, s, q);
    if (!w.drives) {  // smaller side (its gradient comes from the runs) or no partner: gradient 0
      if (me.grad && !w.inside) me.grad[me.perm[q]] = T(0);
      continue;
    }
    const int64_t i = q - w.lo, nL = w.hi - w.lo, nS = w.ohi - w.olo;
    const LargerTerms tm = larger_terms(static_cast<acc_t>(me.value(q)), SegmentValues<T, I>{&other, w.olo}, i, nL, nS);
    if (me.grad) me.grad[me.perm[q]] = static_cast<T>(grad_scale(nL, nS) * tm.grad);
    int64_t j, unused, run_lo, run_hi;
    overlap_range(i, nL, nS, &j, &unused);
    first_overlap_run(j, nL, nS, &run_lo, &run_hi);
    cost[k] = RunSum{q == w.lo, tm.cost};
    run[k] = RunSum{i == run_lo, tm.first};
  }
  Scan(scan_tmp).InclusiveScan(cost, cost, RunSumOp());
  __syncthreads();
  Scan(scan_tmp).InclusiveScan(run, run, RunSumOp());
  const TileSlots& sl = p.slots[side];
  s = -1;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {  // the same walk again: piece ends
    const int64_t q = q0 + k;
    if (q >= me.N) continue;
    s = segment_of(me.off, p.S, tidy, s, q);
    const Where w = locate(me, other, side == 0, s, q);
    if (!w.drives) continue;
    if (piece_ends(w.hi, q)) {  // the segment's cost run
      const int kind = piece_kind(w.lo, w.hi, q);
      if (kind == kPieceFinal) p.cost[w.s] = acc_t(0) + cost[k].v;
      else if (kind == kPieceTail) sl.cost_tail()[t] = cost[k].v;
      else sl.cost_head()[t] = cost[k].v;
    }
    if (!other.grad) continue;
    const int64_t i = q - w.lo, nL = w.hi - w.lo, nS = w.ohi - w.olo;
    int64_t j, unused, run_lo, run_hi;
    overlap_range(i, nL, nS, &j, &unused);
    first_overlap_run(j, nL, nS, &run_lo, &run_hi);
    if (!piece_ends(w.lo + run_hi, q)) continue;
    const int kind = piece_kind(w.lo + run_lo, w.lo + run_hi, q);
    if (kind == kPieceFinal) finish_smaller(me, other, w, j, acc_t(0) + run[k].v);
    else if (kind == kPieceTail) sl.run_tail()[t] = run[k].v;
    else sl.run_head()[t] = run[k].v;
  }
}

// Level 2: thread per tile; the runs holding the tile's last position that start in it and cross.
template <typename T, typename I>
__global__ void w2_combine_kernel(TileParams<T, I> p, int64_t tiles_u, int64_t tiles_v) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < tiles_u + tiles_v;
       b += int64_t(gridDim.x) * blockDim.x) {
    const int side = b < tiles_u ? 0 : 1;
    const int64_t t = side == 0 ? b : b - tiles_u;
    const SortedSide<T, I>& me = p.side[side];
    const SortedSide<T, I>& other = p.side[1 - side];
    const int64_t q = ((t + 1) * kTile < me.N ? (t + 1) * kTile : me.N) - 1;
    const Where w = locate(me, other, side == 0, find_segment(me.off, p.S, q), q);
    if (!w.drives) continue;
    const TileSlots& sl = p.slots[side];
    if (piece_kind(w.lo, w.hi, q) == kPieceTail)
      p.cost[w.s] = combine_pieces(w.lo, w.hi, sl.cost_tail(), sl.cost_head(), 0);
    if (!other.grad) continue;
    const int64_t i = q - w.lo, nL = w.hi - w.lo, nS = w.ohi - w.olo;
    int64_t j, unused, run_lo, run_hi;
    overlap_range(i, nL, nS, &j, &unused);
    first_overlap_run(j, nL, nS, &run_lo, &run_hi);
    if (piece_kind(w.lo + run_lo, w.lo + run_hi, q) == kPieceTail)
      finish_smaller(me, other, w, j, combine_pieces(w.lo + run_lo, w.lo + run_hi, sl.run_tail(), sl.run_head(), 0));
  }
}

// flag[0] = 0 unless off (S+1 entries) partitions [0, N): first 0, last N, non-decreasing.
__global__ void w2_tidy_kernel(const int64_t* __restrict__ off, int64_t S, int64_t N, int* __restrict__ flag) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s <= S; s += int64_t(gridDim.x) * blockDim.x) {
    const bool ok = s == 0 ? off[0] == 0 : (off[s] >= off[s - 1] && (s < S || off[S] == N));
    if (!ok) *flag = 0;  // every writer stores 0: the outcome does not depend on the order
  }
}

template <typename T>
__global__ void w2_finish_kernel(const acc_t* cost, const int64_t* uo, const int64_t* vo, int64_t S,
                                 int64_t Nu, int64_t Nv, T* out) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < S; s += int64_t(gridDim.x) * blockDim.x) {
    int64_t ulo, uhi, vlo, vhi;
    segment_bounds(uo, s, Nu, &ulo, &uhi);
    segment_bounds(vo, s, Nv, &vlo, &vhi);
    const int64_t na = uhi - ulo, nb = vhi - vlo;
    out[s] = (na == 0 || nb == 0) ? static_cast<T>(from_bits(KeyOf<T>::kNaN))
                                  : static_cast<T>(w2_of_cost(cost[s], na, nb));
  }
}

// ------------------------------------------------------------------------------------------------
// Stable segmented argsort by device-wide radix sort.
// ------------------------------------------------------------------------------------------------
// keys[p] = segment(p) << 32 | key32(x[p]) (float32, several segments) or key(x[p]); idx[p] = p.
template <typename T, typename K, typename I>
__global__ void make_keys_kernel(const T* __restrict__ x, const int64_t* __restrict__ off, int64_t S,
                                 int64_t N, bool with_segment, K* __restrict__ keys, I* __restrict__ idx) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < N; p += int64_t(gridDim.x) * blockDim.x) {
    K k = static_cast<K>(sort_key(x[p]));
    if (with_segment) k |= static_cast<K>(static_cast<uint64_t>(find_segment(off, S, p)) << 32);
    keys[p] = k;
    idx[p] = static_cast<I>(p);
  }
}

template <typename I>
__global__ void segment_of_source_kernel(const int64_t* __restrict__ off, int64_t S, int64_t N,
                                         const I* __restrict__ idx, uint64_t* __restrict__ seg) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < N; p += int64_t(gridDim.x) * blockDim.x)
    seg[p] = static_cast<uint64_t>(find_segment(off, S, static_cast<int64_t>(idx[p])));
}

inline int bits_for(int64_t S) {  // bits of the largest segment id S-1
  int b = 0;
  while (b < 63 && (int64_t(1) << b) < S) ++b;
  return b;
}

template <typename K, typename I>
void radix_sort_pairs(cub::DoubleBuffer<K>& keys, cub::DoubleBuffer<I>& vals, int64_t N, int end_bit,
                      const at::TensorOptions& opts, cudaStream_t stream) {
  size_t bytes = 0;
  const bool small = N <= std::numeric_limits<int>::max();
  auto sort = [&](void* tmp) {
    if (small) return cub::DeviceRadixSort::SortPairs(tmp, bytes, keys, vals, static_cast<int>(N), 0, end_bit, stream);
    return cub::DeviceRadixSort::SortPairs(tmp, bytes, keys, vals, N, 0, end_bit, stream);
  };
  C10_CUDA_CHECK(sort(nullptr));
  auto temp = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(sort(temp.data_ptr()));
}

// The sorted side, its storage kept alive in `hold`.
template <typename T, typename I>
SortedSide<T, I> device_argsort(const at::Tensor& x, const at::Tensor& off, at::Tensor& hold, T* grad,
                                cudaStream_t stream) {
  const int64_t N = x.numel(), S = off.numel() - 1;
  SortedSide<T, I> side{x.data_ptr<T>(), nullptr, nullptr, nullptr, off.data_ptr<int64_t>(), N, grad};
  if (N == 0) return side;
  const auto opts = x.options();
  constexpr int B = 256;
  const unsigned G = grid_for(N, B);
  const int sbits = bits_for(S);
  const bool keys32 = sizeof(T) == 4 && S == 1;  // one float32 segment: 32-bit keys
  // [keys, keys alt, idx, idx alt] in one allocation of 8-byte words.
  const int64_t key_words = keys32 ? N : 2 * N, idx_words = sizeof(I) == 4 ? N : 2 * N;
  hold = at::empty({key_words + idx_words}, opts.dtype(at::kLong));
  auto* w = reinterpret_cast<uint64_t*>(hold.data_ptr<int64_t>());
  I* idx = reinterpret_cast<I*>(w + key_words);
  if (keys32) {
    auto* k = reinterpret_cast<uint32_t*>(w);
    make_keys_kernel<T, uint32_t, I><<<G, B, 0, stream>>>(x.data_ptr<T>(), side.off, S, N, false, k, idx);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    cub::DoubleBuffer<uint32_t> keys(k, k + N);
    cub::DoubleBuffer<I> vals(idx, idx + N);
    radix_sort_pairs(keys, vals, N, 32, opts, stream);
    side.keys32 = keys.Current();
    side.perm = vals.Current();
    return side;
  }
  const bool fused = sizeof(T) == 4 || S == 1;  // float32: segment id above the 32 value bits
  make_keys_kernel<T, uint64_t, I><<<G, B, 0, stream>>>(x.data_ptr<T>(), side.off, S, N, sizeof(T) == 4, w, idx);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  cub::DoubleBuffer<uint64_t> keys(w, w + N);
  cub::DoubleBuffer<I> vals(idx, idx + N);
  radix_sort_pairs(keys, vals, N, fused ? (sizeof(T) == 4 ? 32 + sbits : 64) : 64, opts, stream);
  if (fused) {
    side.keys64 = keys.Current();
    side.perm = vals.Current();
    return side;
  }
  // float64 with several segments: then a stable pass by segment id (values gathered later).
  segment_of_source_kernel<I><<<G, B, 0, stream>>>(side.off, S, N, vals.Current(), keys.Current());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  radix_sort_pairs(keys, vals, N, std::max(sbits, 1), opts, stream);
  side.perm = vals.Current();
  return side;
}

template <typename T, typename I>
void launch_device_path(const at::Tensor& u, const at::Tensor& v, const at::Tensor& uo,
                        const at::Tensor& vo, at::Tensor& out, T* du, T* dv, cudaStream_t stream) {
  const int64_t S = uo.numel() - 1;
  at::Tensor hold_u, hold_v;
  TileParams<T, I> p;
  p.side[0] = device_argsort<T, I>(u, uo, hold_u, du, stream);
  p.side[1] = device_argsort<T, I>(v, vo, hold_v, dv, stream);
  p.S = S;
  const int64_t tiles_u = (u.numel() + kTile - 1) / kTile, tiles_v = (v.numel() + kTile - 1) / kTile;
  // Zeroed: with malformed offsets (validate=False) some entries may never be written.
  auto acc = at::zeros({S + 4 * (tiles_u + tiles_v)}, u.options().dtype(at::kDouble));
  p.cost = acc.data_ptr<double>();
  auto tidy = at::ones({2}, u.options().dtype(at::kInt));
  p.tidy = tidy.data_ptr<int>();
  p.slots[0] = TileSlots{p.cost + S, tiles_u};
  p.slots[1] = TileSlots{p.cost + S + 4 * tiles_u, tiles_v};
  if (tiles_u + tiles_v > 0) {
    w2_tidy_kernel<<<grid_for(S + 1, 256), 256, 0, stream>>>(uo.data_ptr<int64_t>(), S, u.numel(), tidy.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    w2_tidy_kernel<<<grid_for(S + 1, 256), 256, 0, stream>>>(vo.data_ptr<int64_t>(), S, v.numel(), tidy.data_ptr<int>() + 1);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    constexpr int B = 512, ITEMS = kTile / B;
    w2_tile_kernel<T, I, B, ITEMS><<<static_cast<unsigned>(tiles_u + tiles_v), B, 0, stream>>>(p, tiles_u);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    w2_combine_kernel<T, I><<<grid_for(tiles_u + tiles_v, 128), 128, 0, stream>>>(p, tiles_u, tiles_v);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  w2_finish_kernel<T><<<grid_for(S, 256), 256, 0, stream>>>(p.cost, uo.data_ptr<int64_t>(), vo.data_ptr<int64_t>(),
                                                           S, u.numel(), v.numel(), out.data_ptr<T>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace w2
}  // namespace entangle_ext
