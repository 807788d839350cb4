// CPU kernels of entangle_ext::wasserstein2_1d (closed-form 1-D W2^2 by segmented stable sort).
//
// Forward: stable-sort both sides of each segment (csrc/cpu/wasserstein_sort.h; short segments in
// batches), walk the larger side once with the shared terms of csrc/wasserstein.h, and write W2^2
// and, for each side that needs a gradient, dW2^2_s/dx at every input position (scattered through
// the sort permutation). The backward is then elementwise: grad_x[p] = grad[s(p)] * dx[p].
// Work is split over threads by element count: chunks of whole segments, and one long segment at
// a time over all threads (parallel sort, then the fixed tiles of csrc/wasserstein.h). Every sum
// follows the tile order of csrc/wasserstein.h, so results are bitwise the same for any thread count.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <tuple>
#include <vector>

#include "../wasserstein.h"
#include "wasserstein_sort.h"

namespace entangle_ext {
namespace w2 {
namespace cpu {
namespace {

constexpr const char* kOp = "wasserstein2_1d";
constexpr int64_t kLongSegment = int64_t(1) << 16;  // values (u + v) that may get every thread
constexpr int64_t kChunkMin = int64_t(1) << 14;     // values (u + v) per chunk of whole segments

// One side of one segment after sorting. grad (if set) is the side's flat dW2/dx output.
template <typename T>
struct Side {
  T* vals;         // sorted values [0, n)
  uint32_t* perm;  // local source index of each sorted position (null if grad is null)
  int64_t lo, n;   // flat start and length
  T* grad;
};

// Writes the gradient of smaller-side sample j from its run total (sum of its R_j pieces).
template <typename T>
inline void finish_smaller(const Side<T>& L, const Side<T>& Sm, int64_t j, acc_t run_total, acc_t scale) {
  const acc_t g = run_total + smaller_spill(static_cast<acc_t>(Sm.vals[j]), L.vals, j, L.n, Sm.n);
  Sm.grad[Sm.lo + Sm.perm[j]] = static_cast<T>(scale * g);
}

// Sequential walk over the larger side; returns the cost sum. Pieces end at tile boundaries of the
// larger side's flat positions, exactly as in larger_side_tiled.
template <typename T>
acc_t larger_side_sequential(const Side<T>& L, const Side<T>& Sm, acc_t scale) {
  const int64_t nL = L.n, nS = Sm.n;
  acc_t cost_total = 0, cost_piece = 0, run_total = 0, run_piece = 0;
  int64_t j = 0, run_lo = 0, run_hi = 0;
  first_overlap_run(0, nL, nS, &run_lo, &run_hi);
  for (int64_t i = 0; i < nL; ++i) {
    const LargerTerms t = larger_terms(static_cast<acc_t>(L.vals[i]), Sm.vals, i, nL, nS);
    const bool tile_end = ((L.lo + i + 1) % kTile) == 0;
    cost_piece += t.cost;
    if (tile_end || i + 1 == nL) {
      cost_total += cost_piece;
      cost_piece = 0;
    }
    if (L.grad) L.grad[L.lo + L.perm[i]] = static_cast<T>(scale * t.grad);
    if (!Sm.grad) continue;
    run_piece += t.first;
    if (i + 1 == run_hi) {
      run_total += run_piece;
      finish_smaller(L, Sm, j, run_total, scale);
      run_total = run_piece = 0;
      if (++j < nS) first_overlap_run(j, nL, nS, &run_lo, &run_hi);
    } else if (tile_end) {
      run_total += run_piece;
      run_piece = 0;
    }
  }
  return cost_total;
}

// Stores a level-1 piece: FINAL pieces become the run's total (0 + piece), the others go to slots.
inline void store_piece(int kind, int64_t slot, acc_t piece, acc_t* tail, acc_t* head, acc_t* total) {
  if (kind == kPieceTail) tail[slot] = piece;
  else if (kind == kPieceHead) head[slot] = piece;
  else *total = acc_t(0) + piece;
}

// The same sums for one long segment over all threads: level 1 per tile (pieces into FINAL
// results or tail/head slots), level 2 combines the runs that cross tiles (csrc/wasserstein.h).
template <typename T>
acc_t larger_side_tiled(const Side<T>& L, const Side<T>& Sm, acc_t scale) {
  const int64_t nL = L.n, nS = Sm.n, hiL = L.lo + nL;
  const int64_t t0 = L.lo / kTile, t1 = (hiL - 1) / kTile, nt = t1 - t0 + 1;
  std::vector<acc_t> slots(4 * nt, acc_t(0));
  acc_t *cost_tail = slots.data(), *cost_head = cost_tail + nt;
  acc_t *run_tail = cost_head + nt, *run_head = run_tail + nt;
  acc_t cost_total = 0;
  // The run R_j holding larger-side rank i, as flat positions [lo, hi).
  auto run_of = [&](int64_t i, int64_t* j, int64_t* lo, int64_t* hi) {
    int64_t unused;
    overlap_range(i, nL, nS, j, &unused);
    first_overlap_run(*j, nL, nS, lo, hi);
    *lo += L.lo;
    *hi += L.lo;
  };
  at::parallel_for(t0, t1 + 1, 1, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t qb = std::max(L.lo, t * kTile), qe = std::min(hiL, (t + 1) * kTile);
      int64_t j, run_lo, run_hi;
      run_of(qb - L.lo, &j, &run_lo, &run_hi);
      acc_t cost_piece = 0, run_piece = 0;
      for (int64_t q = qb; q < qe; ++q) {
        const int64_t i = q - L.lo;
        const LargerTerms tm = larger_terms(static_cast<acc_t>(L.vals[i]), Sm.vals, i, nL, nS);
        cost_piece += tm.cost;
        if (L.grad) L.grad[L.lo + L.perm[i]] = static_cast<T>(scale * tm.grad);
        if (!Sm.grad) continue;
        run_piece += tm.first;
        if (!piece_ends(run_hi, q)) continue;
        const int kind = piece_kind(run_lo, run_hi, q);
        acc_t total = 0;
        store_piece(kind, t - t0, run_piece, run_tail, run_head, &total);
        if (kind == kPieceFinal) finish_smaller(L, Sm, j, total, scale);
        run_piece = 0;
        if (q + 1 == run_hi && j + 1 < nS) run_of(i + 1, &j, &run_lo, &run_hi);
      }
      store_piece(piece_kind(L.lo, hiL, qe - 1), t - t0, cost_piece, cost_tail, cost_head, &cost_total);
    }
  });
  if (Sm.grad) {  // level 2: the run holding each tile's last position, if it starts there and crosses
    at::parallel_for(t0, t1 + 1, 16, [&](int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        const int64_t q = std::min(hiL, (t + 1) * kTile) - 1;
        int64_t j, run_lo, run_hi;
        run_of(q - L.lo, &j, &run_lo, &run_hi);
        if (piece_kind(run_lo, run_hi, q) != kPieceTail) continue;
        finish_smaller(L, Sm, j, combine_pieces(run_lo, run_hi, run_tail, run_head, t0), scale);
      }
    });
  }
  return t0 == t1 ? cost_total : combine_pieces(L.lo, hiL, cost_tail, cost_head, t0);
}

// Per-call state shared by the segment workers.
template <typename T>
struct Job {
  const T *u, *v;
  const int64_t *uo, *vo;
  int64_t S, Nu, Nv;
  T *w2, *du, *dv;  // du/dv null when not needed
  std::atomic<bool> bad_u{false}, bad_v{false};
};

// Reusable per-thread buffers: sort scratch, sorted values/permutations of a batch, bounds. Kept
// across calls (thread_buffers) up to kKeepScratchBytes per buffer.
template <typename T>
struct Buffers {
  Scratch& sc = thread_scratch();
  std::vector<T> vals;
  std::vector<uint32_t> perm;
  std::vector<int64_t> bounds;  // per batch segment: u lo, u n, v lo, v n (4 arrays of K)
  void trim() {
    sc.trim(kKeepScratchBytes);
    if (vals.capacity() * sizeof(T) > kKeepScratchBytes) std::vector<T>().swap(vals);
    if (perm.capacity() * sizeof(uint32_t) > kKeepScratchBytes) std::vector<uint32_t>().swap(perm);
  }
};

template <typename T>
Buffers<T>& thread_buffers() {
  thread_local Buffers<T> buf;
  return buf;
}

// Walks one segment whose two sides are sorted; writes its W2^2 (NaN if a side is empty).
template <typename T>
void walk_segment(Job<T>& job, int64_t s, Side<T> a, Side<T> b, bool all_threads) {
  if (a.n == 0 || b.n == 0) {  // W2 to an empty distribution: NaN value, zero gradient
    job.w2[s] = std::numeric_limits<T>::quiet_NaN();
    if (a.grad) std::fill(a.grad + a.lo, a.grad + a.lo + a.n, T(0));
    if (b.grad) std::fill(b.grad + b.lo, b.grad + b.lo + b.n, T(0));
    return;
  }
  const bool u_larger = a.n >= b.n;
  const Side<T>& L = u_larger ? a : b;
  const Side<T>& Sm = u_larger ? b : a;
  const acc_t scale = grad_scale(a.n, b.n);
  const acc_t cost = all_threads ? larger_side_tiled(L, Sm, scale) : larger_side_sequential(L, Sm, scale);
  job.w2[s] = static_cast<T>(w2_of_cost(cost, a.n, b.n));
}

// Segments [s0, s1) by one thread: one sort per side for the whole batch, then one walk each.
template <typename T>
void run_batch(Job<T>& job, int64_t s0, int64_t s1, Buffers<T>& buf) {
  const int64_t K = s1 - s0;
  buf.bounds.resize(4 * K);
  int64_t *ulo = buf.bounds.data(), *un = ulo + K, *vlo = un + K, *vn = vlo + K;
  int64_t tu = 0, tv = 0;
  for (int64_t k = 0; k < K; ++k) {
    int64_t hi;
    segment_bounds(job.uo, s0 + k, job.Nu, &ulo[k], &hi);
    un[k] = hi - ulo[k];
    segment_bounds(job.vo, s0 + k, job.Nv, &vlo[k], &hi);
    vn[k] = hi - vlo[k];
    tu += un[k];
    tv += vn[k];
  }
  if (buf.vals.size() < static_cast<size_t>(tu + tv)) buf.vals.resize(tu + tv);
  if ((job.du || job.dv) && buf.perm.size() < static_cast<size_t>(tu + tv)) buf.perm.resize(tu + tv);
  T* uvals = buf.vals.data();
  T* vvals = uvals + tu;
  uint32_t* uperm = job.du ? buf.perm.data() : nullptr;
  uint32_t* vperm = job.dv ? buf.perm.data() + tu : nullptr;
  if (!sort_batch(job.u, ulo, un, K, uvals, uperm, buf.sc)) job.bad_u.store(true, std::memory_order_relaxed);
  if (!sort_batch(job.v, vlo, vn, K, vvals, vperm, buf.sc)) job.bad_v.store(true, std::memory_order_relaxed);
  for (int64_t k = 0, bu = 0, bv = 0; k < K; bu += un[k], bv += vn[k], ++k) {
    walk_segment(job, s0 + k, Side<T>{uvals + bu, uperm ? uperm + bu : nullptr, ulo[k], un[k], job.du},
                 Side<T>{vvals + bv, vperm ? vperm + bv : nullptr, vlo[k], vn[k], job.dv}, false);
  }
}

// One long segment over all threads: parallel sorts, then the tiled walk.
template <typename T>
void run_long(Job<T>& job, int64_t s, Buffers<T>& buf) {
  int64_t ulo, uhi, vlo, vhi;
  segment_bounds(job.uo, s, job.Nu, &ulo, &uhi);
  segment_bounds(job.vo, s, job.Nv, &vlo, &vhi);
  const int64_t na = uhi - ulo, nb = vhi - vlo;
  buf.vals.resize(na + nb);
  if (job.du || job.dv) buf.perm.resize(na + nb);
  Side<T> a{buf.vals.data(), job.du ? buf.perm.data() : nullptr, ulo, na, job.du};
  Side<T> b{buf.vals.data() + na, job.dv ? buf.perm.data() + na : nullptr, vlo, nb, job.dv};
  if (!sort_long(job.u + ulo, na, a.vals, a.perm)) job.bad_u.store(true, std::memory_order_relaxed);
  if (!sort_long(job.v + vlo, nb, b.vals, b.perm)) job.bad_v.store(true, std::memory_order_relaxed);
  walk_segment(job, s, a, b, true);
}

// First segment of each of C chunks of (about) equal element count (offsets partition [0, N)).
inline std::vector<int64_t> chunk_starts(const int64_t* uo, const int64_t* vo, int64_t S, int64_t C) {
  std::vector<int64_t> starts(C + 1, S);
  const int64_t total = uo[S] + vo[S];
  int64_t s = 0;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t target = total * c / C;
    while (s < S && uo[s] + vo[s] < target) ++s;
    starts[c] = s;
  }
  return starts;
}

// Segments [begin, end) except the long ones, in batches of at most kBatchMax values per side.
template <typename T>
void run_chunk(Job<T>& job, int64_t begin, int64_t end, const std::vector<int64_t>& long_segments,
               Buffers<T>& buf) {
  auto next_long = std::lower_bound(long_segments.begin(), long_segments.end(), begin);
  for (int64_t s = begin; s < end;) {
    if (next_long != long_segments.end() && *next_long == s) {
      ++next_long;
      ++s;
      continue;
    }
    const int64_t s0 = s, stop = next_long != long_segments.end() ? std::min(end, *next_long) : end;
    int64_t tu = 0, tv = 0;
    for (; s < stop && s - s0 < kBatchMax; ++s) {
      int64_t lo, hi, lo2, hi2;
      segment_bounds(job.uo, s, job.Nu, &lo, &hi);
      segment_bounds(job.vo, s, job.Nv, &lo2, &hi2);
      if (s > s0 && (tu + hi - lo > kBatchMax || tv + hi2 - lo2 > kBatchMax)) break;
      tu += hi - lo;
      tv += hi2 - lo2;
    }
    run_batch(job, s0, s, buf);
  }
}

template <typename T>
void forward_impl(Job<T>& job, bool tidy) {
  const int64_t S = job.S;
  const int threads = at::get_num_threads();
  // A segment gets every thread when it is long and would hold up one thread's share of the work.
  std::vector<int64_t> long_segments;
  if (tidy && threads > 1) {
    const int64_t share = std::max(kLongSegment, (job.Nu + job.Nv) / (2 * threads));
    for (int64_t s = 0; s < S; ++s)
      if ((job.uo[s + 1] - job.uo[s]) + (job.vo[s + 1] - job.vo[s]) >= share) long_segments.push_back(s);
  }
  // Malformed offsets may overlap: then one thread, in segment order (deterministic).
  // Chunks of at least kChunkMin values (forking threads costs more than sorting fewer values).
  const int64_t C = tidy ? std::max<int64_t>(1, std::min({S, int64_t(threads) * 8, (job.Nu + job.Nv) / kChunkMin})) : 1;
  const std::vector<int64_t> starts = tidy ? chunk_starts(job.uo, job.vo, S, C) : std::vector<int64_t>{0, S};
  at::parallel_for(0, C, 1, [&](int64_t cb, int64_t ce) {
    Buffers<T>& buf = thread_buffers<T>();
    for (int64_t c = cb; c < ce; ++c) run_chunk(job, starts[c], starts[c + 1], long_segments, buf);
    buf.trim();
  });
  Buffers<T>& buf = thread_buffers<T>();
  for (int64_t s : long_segments) run_long(job, s, buf);
  buf.trim();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> w2_forward_cpu(
    const at::Tensor& u, const at::Tensor& v, const at::Tensor& u_offsets,
    const at::Tensor& v_offsets, int64_t max_seqlen, bool grad_u, bool grad_v, bool validate) {
  check_w2_inputs(u, v, u_offsets, v_offsets, kOp);
  const int64_t S = u_offsets.numel() - 1, Nu = u.numel(), Nv = v.numel();
  const int64_t* uo = u_offsets.data_ptr<int64_t>();
  const int64_t* vo = v_offsets.data_ptr<int64_t>();
  if (validate) {
    const int64_t lu = check_w2_offsets_values(uo, S, Nu, "u_offsets", "u", kOp);
    const int64_t lv = check_w2_offsets_values(vo, S, Nv, "v_offsets", "v", kOp);
    check_w2_max_seqlen(max_seqlen, std::max(lu, lv), kOp);
  }
  const bool tidy = validate || (offsets_partition(uo, S, Nu) && offsets_partition(vo, S, Nv));
  auto w2 = at::empty({S}, u.options());
  // Untidy offsets may leave positions in no segment: their gradient is 0.
  auto grad_out = [&](bool need, const at::Tensor& x) {
    if (!need) return at::empty({0}, x.options());
    return tidy ? at::empty_like(x) : at::zeros_like(x);
  };
  auto du = grad_out(grad_u, u), dv = grad_out(grad_v, v);
  if (S == 0) return {w2, du, dv};
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "wasserstein2_1d_cpu", [&] {
    Job<scalar_t> job;
    job.u = u.data_ptr<scalar_t>();
    job.v = v.data_ptr<scalar_t>();
    job.uo = uo;
    job.vo = vo;
    job.S = S;
    job.Nu = Nu;
    job.Nv = Nv;
    job.w2 = w2.data_ptr<scalar_t>();
    job.du = grad_u ? du.data_ptr<scalar_t>() : nullptr;
    job.dv = grad_v ? dv.data_ptr<scalar_t>() : nullptr;
    forward_impl(job, tidy);
    if (validate) {
      check_w2_finite(!job.bad_u.load(), "u", kOp);
      check_w2_finite(!job.bad_v.load(), "v", kOp);
    }
  });
  return {w2, du, dv};
}

// grad_x[p] = grad[s] * dx[p] for the segment s = find_segment(p) that owns p (0 outside its
// clamped bounds, which only malformed offsets leave).
template <typename T>
void backward_side(const T* grad, const T* dx, const int64_t* off, int64_t S, int64_t N, T* gx) {
  if (S == 0) {
    std::fill(gx, gx + N, T(0));
    return;
  }
  const bool tidy = offsets_partition(off, S, N);
  at::parallel_for(0, N, 32768, [&](int64_t b, int64_t e) {
    if (tidy) {  // walk the segments in order; the inner loop vectorises
      int64_t s = find_segment(off, S, b);
      for (int64_t p = b; p < e;) {
        while (s + 1 < S && off[s + 1] <= p) ++s;
        const int64_t end = std::min(off[s + 1], e);
        const T gs = grad[s];
        for (; p < end; ++p) gx[p] = gs * dx[p];
      }
      return;
    }
    for (int64_t p = b; p < e; ++p) {
      int64_t lo, hi;
      const int64_t s = find_segment(off, S, p);
      segment_bounds(off, s, N, &lo, &hi);
      gx[p] = (p >= lo && p < hi) ? grad[s] * dx[p] : T(0);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> w2_backward_cpu(const at::Tensor& grad, const at::Tensor& du,
                                                   const at::Tensor& dv, const at::Tensor& u_offsets,
                                                   const at::Tensor& v_offsets) {
  check_w2_backward_inputs(grad, du, dv, u_offsets, v_offsets);
  const int64_t S = u_offsets.numel() - 1;
  auto gu = at::empty_like(du), gv = at::empty_like(dv);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "wasserstein2_1d_backward_cpu", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    backward_side(g, du.data_ptr<scalar_t>(), u_offsets.data_ptr<int64_t>(), S, du.numel(), gu.data_ptr<scalar_t>());
    backward_side(g, dv.data_ptr<scalar_t>(), v_offsets.data_ptr<int64_t>(), S, dv.numel(), gv.data_ptr<scalar_t>());
  });
  return {gu, gv};
}

}  // namespace
}  // namespace cpu
}  // namespace w2

TORCH_LIBRARY_IMPL(entangle_ext, CPU, m) {
  m.impl("wasserstein2_1d", &w2::cpu::w2_forward_cpu);
  m.impl("wasserstein2_1d_backward", &w2::cpu::w2_backward_cpu);
}

}  // namespace entangle_ext
