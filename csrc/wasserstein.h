// Shared pieces of entangle_ext::wasserstein2_1d (CPU and CUDA): argument and offset checks, and
// the host-and-device (ENTANGLE_HD) helpers both kernels run, so that the CPU tests exercise the
// index logic of the CUDA kernels: order-preserving sort keys, segment bounds, the exact
// unequal-size overlap math, and the fixed-order tiled sums (docs/algorithm.md §4).
//
// Math. Segment s holds sorted a (n_a values) and sorted b (n_b values). Sample i of a covers the
// quantiles [i/n_a, (i+1)/n_a), sample j of b covers [j/n_b, (j+1)/n_b); in integer units of
// 1/(n_a n_b) their overlap is w_ij = max(0, min((i+1) n_b, (j+1) n_a) - max(i n_b, j n_a)), and
//   W2^2 = sum_ij w_ij (a_i - b_j)^2 / (n_a n_b),   dW2^2/da_i = 2 sum_j w_ij (a_i - b_j) / (n_a n_b).
// The larger side L (u when n_u >= n_v, else v; n_L >= n_S) drives: each of its samples overlaps at
// most two samples of the smaller side S, so its cost and gradient terms are O(1). The gradient of a
// smaller-side sample j is a sum over the run R_j = {i : first overlap of i is j} (consecutive
// larger-side positions) plus at most one "spill" term from the sample straddling quantile j/n_S.
//
// Summation order (deterministic, independent of thread count and of the segment-length mix):
// every sum over larger-side positions (a segment's cost, a run R_j) is split at the fixed tiles
// [t kTile, (t+1) kTile) of that side's flat array; each piece is summed on its own (sequentially
// on the CPU, by a block-wide scan on CUDA), and the pieces are added left to right starting from
// 0.0 (combine_pieces). Accumulation is float64 for float32 and float64 inputs alike. (The CUDA
// block path, for segments of at most 2048 values, sums a whole segment in one block instead.)
#pragma once

#include "common.h"

#include <cstdint>
#include <cstring>

namespace entangle_ext {
namespace w2 {

using acc_t = double;              // accumulation type of every W2 sum (float32 and float64 inputs)
constexpr int64_t kTile = 4096;    // tile of the fixed-order sums (flat positions of one side)

// ---------------------------------------------------------------------------------------------
// Order-preserving unsigned keys: x < y  <=>  key(x) < key(y). NaN (any payload/sign) becomes the
// canonical +NaN, which sorts after +Inf (as torch.sort puts NaN last); -0.0 becomes +0.0 so that
// +0 and -0 tie and keep their input order. key_value() inverts the map (NaN -> +NaN, -0 -> +0).
// ---------------------------------------------------------------------------------------------
template <typename T>
struct KeyOf;
template <>
struct KeyOf<float> {
  using type = uint32_t;
  static constexpr uint32_t kSign = 0x80000000u;
  static constexpr uint32_t kNaN = 0x7fc00000u;
  static constexpr uint32_t kAbsInf = 0x7f800000u;
  // Keys of -Inf and +Inf: x is finite iff kNegInfKey < key(x) < kPosInfKey.
  static constexpr uint32_t kNegInfKey = 0x007fffffu;
  static constexpr uint32_t kPosInfKey = 0xff800000u;
};
template <>
struct KeyOf<double> {
  using type = uint64_t;
  static constexpr uint64_t kSign = 0x8000000000000000ull;
  static constexpr uint64_t kNaN = 0x7ff8000000000000ull;
  static constexpr uint64_t kAbsInf = 0x7ff0000000000000ull;
  static constexpr uint64_t kNegInfKey = 0x000fffffffffffffull;
  static constexpr uint64_t kPosInfKey = 0xfff0000000000000ull;
};

ENTANGLE_HD uint32_t to_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}
ENTANGLE_HD uint64_t to_bits(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}
ENTANGLE_HD float from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}
ENTANGLE_HD double from_bits(uint64_t b) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

// Both maps are branch-free (random signs would otherwise mispredict on every other value).
template <typename T>
ENTANGLE_HD typename KeyOf<T>::type sort_key(T x) {
  using K = KeyOf<T>;
  using U = typename K::type;
  constexpr int kTop = sizeof(U) * 8 - 1;
  U b = to_bits(x);
  const U mag = b & ~K::kSign;
  b = mag > K::kAbsInf ? K::kNaN : b;  // any NaN -> canonical +NaN
  b = mag == 0 ? U(0) : b;             // -0 -> +0
  const U neg = U(0) - (b >> kTop);    // all ones for negative values
  return b ^ (neg | K::kSign);         // negative: ~b; otherwise: b | sign
}

template <typename T>
ENTANGLE_HD T key_value(typename KeyOf<T>::type k) {
  using K = KeyOf<T>;
  using U = typename K::type;
  constexpr int kTop = sizeof(U) * 8 - 1;
  const U low = (k >> kTop) - U(1);     // all ones for keys of negative values
  return from_bits(static_cast<U>(k ^ (low | K::kSign)));
}

template <typename T>
ENTANGLE_HD bool key_is_finite(typename KeyOf<T>::type k) {
  return k > KeyOf<T>::kNegInfKey && k < KeyOf<T>::kPosInfKey;
}

// ---------------------------------------------------------------------------------------------
// Segments (cu_seqlens offsets). Bounds are clamped so that malformed offsets (validate=False)
// can never index out of range: lo = clamp(off[s], 0, n), hi = clamp(off[s+1], lo, n).
// ---------------------------------------------------------------------------------------------
ENTANGLE_HD void segment_bounds(const int64_t* off, int64_t s, int64_t n, int64_t* lo, int64_t* hi) {
  int64_t a = off[s];
  a = a < 0 ? 0 : (a > n ? n : a);
  int64_t b = off[s + 1];
  b = b < a ? a : (b > n ? n : b);
  *lo = a;
  *hi = b;
}

// The segment that owns flat position p: the last s in [0, S-1] with off[s] <= p (0 if none).
ENTANGLE_HD int64_t find_segment(const int64_t* off, int64_t S, int64_t p) {
  int64_t lo = 0, hi = S;
  while (hi - lo > 1) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (off[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

// ---------------------------------------------------------------------------------------------
// Overlap math (integer units of 1/(n_a n_b); segment lengths below 2^31 keep products in int64).
// ---------------------------------------------------------------------------------------------
// The range [j_lo, j_hi] (inclusive) of b-samples that overlap a-sample i.
ENTANGLE_HD void overlap_range(int64_t i, int64_t na, int64_t nb, int64_t* j_lo, int64_t* j_hi) {
  *j_lo = (i * nb) / na;
  *j_hi = ((i + 1) * nb - 1) / na;
}

ENTANGLE_HD int64_t overlap_weight(int64_t i, int64_t j, int64_t na, int64_t nb) {
  const int64_t lo = (i * nb > j * na) ? i * nb : j * na;
  const int64_t hi = ((i + 1) * nb < (j + 1) * na) ? (i + 1) * nb : (j + 1) * na;
  return hi > lo ? hi - lo : 0;
}

// R_j = [run_lo, run_hi): the larger-side positions whose first overlapped smaller-side sample is
// j (n_L >= n_S >= 1). The runs are consecutive, disjoint, non-empty and cover [0, n_L).
ENTANGLE_HD void first_overlap_run(int64_t j, int64_t nL, int64_t nS, int64_t* run_lo, int64_t* run_hi) {
  if (nL == nS) {  // equal sizes: R_j = {j}
    *run_lo = j;
    *run_hi = j + 1;
    return;
  }
  *run_lo = (j * nL + nS - 1) / nS;
  *run_hi = ((j + 1) * nL + nS - 1) / nS;
}

// Per-sample terms of a larger-side sample i (value li) against the sorted smaller side s[]:
//   cost  = sum_j w_ij (li - s_j)^2            (its share of n_L n_S W2^2)
//   grad  = sum_j w_ij (li - s_j)              ((n_L n_S / 2) dW2^2/dl_i)
//   first = w_ij0 (s_j0 - li), j0 = first overlap  (its term in the smaller side's run R_j0)
// Seq is anything with operator[](int64_t) returning a value (pointer, shared-memory array, view).
struct LargerTerms {
  acc_t cost, grad, first;
};

template <typename Seq>
ENTANGLE_HD LargerTerms larger_terms(acc_t li, const Seq& s, int64_t i, int64_t nL, int64_t nS) {
  if (nL == nS) {  // equal sizes: rank pairing, w_ii = n (no integer divisions)
    const acc_t n = static_cast<acc_t>(nL);
    const acc_t d = li - static_cast<acc_t>(s[i]);
    return {n * d * d, n * d, -(n * d)};
  }
  int64_t j_lo, j_hi;
  overlap_range(i, nL, nS, &j_lo, &j_hi);
  const acc_t w0 = static_cast<acc_t>(overlap_weight(i, j_lo, nL, nS));
  const acc_t d0 = li - static_cast<acc_t>(s[j_lo]);
  LargerTerms t{w0 * d0 * d0, w0 * d0, -(w0 * d0)};
  if (j_hi != j_lo) {
    const acc_t w1 = static_cast<acc_t>(overlap_weight(i, j_hi, nL, nS));
    const acc_t d1 = li - static_cast<acc_t>(s[j_hi]);
    t.cost += w1 * d1 * d1;
    t.grad += w1 * d1;
  }
  return t;
}

// The spill term of smaller-side sample j (value sj): w_{i*j} (sj - l_{i*}) for the larger-side
// sample i* that straddles quantile j/n_S (its first overlap is j-1), or 0 if none does.
template <typename Seq>
ENTANGLE_HD acc_t smaller_spill(acc_t sj, const Seq& l, int64_t j, int64_t nL, int64_t nS) {
  if (j == 0 || nL == nS || (j * nL) % nS == 0) return 0;
  const int64_t i = (j * nL) / nS;
  return static_cast<acc_t>(overlap_weight(i, j, nL, nS)) * (sj - static_cast<acc_t>(l[i]));
}

// Scale from the overlap sums to dW2^2/dx: 2 / (n_a n_b); and the W2^2 of a cost sum.
ENTANGLE_HD acc_t grad_scale(int64_t na, int64_t nb) {
  return acc_t(2) / (static_cast<acc_t>(na) * static_cast<acc_t>(nb));
}
ENTANGLE_HD acc_t w2_of_cost(acc_t cost, int64_t na, int64_t nb) {
  return cost / (static_cast<acc_t>(na) * static_cast<acc_t>(nb));
}

// ---------------------------------------------------------------------------------------------
// Fixed-order tiled sums. A run [lo, hi) of flat positions meets the tiles ts = lo / kTile ..
// te = (hi-1) / kTile. Level 1 sums each piece (the run's part in one tile); the piece that ends
// a run inside one tile is FINAL; otherwise the run's piece in its first tile goes to tail[ts],
// and its piece in every later tile to head[t] (the run holds the first position of those
// tiles). Level 2: the owner of tile ts (the run holding ts's last position and starting in ts)
// combines
//   total = ((0 + tail[ts]) + head[ts+1]) + ... + head[te].
// ---------------------------------------------------------------------------------------------
enum PieceKind : int { kPieceFinal = 0, kPieceTail = 1, kPieceHead = 2 };

// Kind of the piece of run [lo, hi) that ends at position q (q = hi-1 or the last position of q's tile).
ENTANGLE_HD int piece_kind(int64_t lo, int64_t hi, int64_t q) {
  const int64_t t0 = (q / kTile) * kTile;
  if (lo < t0) return kPieceHead;
  return hi <= t0 + kTile ? kPieceFinal : kPieceTail;
}

// True when a piece ends at position q of run [lo, hi): the run ends or the tile ends there.
ENTANGLE_HD bool piece_ends(int64_t hi, int64_t q) { return q + 1 == hi || (q + 1) % kTile == 0; }

// Level 2 for a run [lo, hi) that crosses tiles (tile arrays indexed by absolute tile number minus
// tile_base, so a caller may keep slots for a window of tiles only).
ENTANGLE_HD acc_t combine_pieces(int64_t lo, int64_t hi, const acc_t* tail, const acc_t* head,
                                 int64_t tile_base) {
  const int64_t ts = lo / kTile, te = (hi - 1) / kTile;
  acc_t total = 0;
  total += tail[ts - tile_base];
  for (int64_t t = ts + 1; t <= te; ++t) total += head[t - tile_base];
  return total;
}

}  // namespace w2

// ---------------------------------------------------------------------------------------------
// Host-side argument checks (raise ValueError/TypeError in Python).
// ---------------------------------------------------------------------------------------------
inline void check_offsets(const at::Tensor& off, const char* op, const char* name) {
  TORCH_CHECK_TYPE(off.scalar_type() == at::kLong, op, ": ", name,
                   " must be int64 (the Python wrapper converts int32 cu_seqlens)");
  check_dim(off, 1, op, name);
  check_contiguous(off, op, name);
  TORCH_CHECK_VALUE(off.numel() >= 1, op, ": ", name,
                    " must hold S+1 >= 1 prefix sums (cu_seqlens convention)");
}

inline void check_w2_inputs(const at::Tensor& u, const at::Tensor& v, const at::Tensor& u_offsets,
                            const at::Tensor& v_offsets, const char* op) {
  check_dim(u, 1, op, "u");
  check_dim(v, 1, op, "v");
  check_floating(u, op, "u");
  TORCH_CHECK_TYPE(u.scalar_type() == v.scalar_type(), op, ": u is ", dtype_name(u), " but v is ",
                   dtype_name(v));
  check_contiguous(u, op, "u");
  check_contiguous(v, op, "v");
  check_offsets(u_offsets, op, "u_offsets");
  check_offsets(v_offsets, op, "v_offsets");
  TORCH_CHECK_VALUE(u_offsets.numel() == v_offsets.numel(), op,
                    ": u and v must have the same number of segments, got ",
                    u_offsets.numel() - 1, " and ", v_offsets.numel() - 1);
  check_same_device(u, v, op, "u", "v");
  check_same_device(u, u_offsets, op, "u", "u_offsets");
  check_same_device(u, v_offsets, op, "u", "v_offsets");
}

inline void check_w2_backward_inputs(const at::Tensor& grad, const at::Tensor& du,
                                     const at::Tensor& dv, const at::Tensor& u_offsets,
                                     const at::Tensor& v_offsets) {
  const char* op = "wasserstein2_1d_backward";
  check_dim(grad, 1, op, "grad");
  check_dim(du, 1, op, "du");
  check_dim(dv, 1, op, "dv");
  check_floating(grad, op, "grad");
  TORCH_CHECK_TYPE(du.scalar_type() == grad.scalar_type() && dv.scalar_type() == grad.scalar_type(),
                   op, ": grad, du and dv must share one dtype, got ", dtype_name(grad), ", ",
                   dtype_name(du), " and ", dtype_name(dv));
  check_contiguous(grad, op, "grad");
  check_contiguous(du, op, "du");
  check_contiguous(dv, op, "dv");
  check_offsets(u_offsets, op, "u_offsets");
  check_offsets(v_offsets, op, "v_offsets");
  TORCH_CHECK_VALUE(grad.numel() == u_offsets.numel() - 1 && u_offsets.numel() == v_offsets.numel(),
                    op, ": grad must have one entry per segment");
  for (const at::Tensor* t : {&du, &dv, &u_offsets, &v_offsets})
    check_same_device(grad, *t, op, "grad", "a saved tensor");
}

// The data checks of validate=True on host copies of the offsets: first 0, last N, non-decreasing,
// no empty segment, and a max_seqlen hint (if >= 0) at least the longest segment. Returns the
// longest segment length.
inline int64_t check_w2_offsets_values(const int64_t* off, int64_t S, int64_t N, const char* name,
                                       const char* side, const char* op) {
  TORCH_CHECK_VALUE(off[0] == 0 && off[S] == N, op, ": ", name,
                    " must start at 0 and end at the number of values (", N, "); got ", off[0],
                    " ... ", off[S]);
  for (int64_t s = 0; s < S; ++s)
    TORCH_CHECK_VALUE(off[s + 1] >= off[s], op, ": ", name, " must be non-decreasing");
  int64_t longest = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = off[s + 1] - off[s];
    TORCH_CHECK_VALUE(n > 0, op, ": segment ", s, " of ", side, " is empty; W2 to an empty ",
                      "distribution is undefined (validate=False gives NaN for it)");
    longest = n > longest ? n : longest;
  }
  return longest;
}

inline void check_w2_max_seqlen(int64_t max_seqlen, int64_t longest, const char* op) {
  TORCH_CHECK_VALUE(max_seqlen < 0 || max_seqlen >= longest, op, ": max_seqlen=", max_seqlen,
                    " but the longest segment has ", longest, " values");
}

inline void check_w2_finite(bool finite, const char* side, const char* op) {
  TORCH_CHECK_VALUE(finite, op, ": ", side, " contains NaN or Inf. Remove them, or pass ",
                    "validate=False to get NaN for the affected segments instead of an error.");
}

// True when the offsets partition [0, N) (first 0, last N, non-decreasing): then every flat
// position lies in exactly one segment. Malformed offsets (validate=False) are clamped instead.
inline bool offsets_partition(const int64_t* off, int64_t S, int64_t N) {
  if (off[0] != 0 || off[S] != N) return false;
  for (int64_t s = 0; s < S; ++s)
    if (off[s + 1] < off[s]) return false;
  return true;
}

}  // namespace entangle_ext
