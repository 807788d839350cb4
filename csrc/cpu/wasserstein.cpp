// CPU kernels of entangle_ext::wasserstein2_1d (closed-form 1-D W2^2 by segmented stable sort).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/AccumulateType.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <tuple>
#include <vector>

#include "../common.h"
#include "../wasserstein_checks.h"

namespace entangle_ext {
namespace {

// Segment bounds, clamped so that malformed offsets can never index out of range.
inline void segment_bounds(const int64_t* off, int64_t s, int64_t n, int64_t* lo, int64_t* hi) {
  int64_t a = std::min(std::max(off[s], int64_t(0)), n);
  int64_t b = std::min(std::max(off[s + 1], a), n);
  *lo = a;
  *hi = b;
}

// Order-preserving unsigned keys (the same map as the CUDA kernels): NaN is canonicalised to +NaN
// (sorts last, like torch.sort) and -0.0 to +0.0 (so that +0/-0 tie and keep their input order).
inline uint32_t sort_key(float x) {
  if (std::isnan(x)) x = std::numeric_limits<float>::quiet_NaN();
  if (x == 0.f) x = 0.f;
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
inline uint64_t sort_key(double x) {
  if (std::isnan(x)) x = std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) x = 0.0;
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}

// Stable sort of x[lo:hi): writes the global source indices to perm[lo:hi) and the sorted values
// to sorted[0:n). Sorting (key, index) as one integer (float32) or an integer pair (float64)
// makes every element distinct, so an unstable std::sort gives the stable order with cheap
// integer compares.
struct SortScratch {
  std::vector<uint64_t> packed;                      // float32: key << 32 | local index
  std::vector<std::pair<uint64_t, int64_t>> pairs;   // float64, or float32 segments >= 2^32
};

template <typename scalar_t>
void stable_sort_segment(const scalar_t* x, int64_t lo, int64_t hi, int64_t* perm,
                         SortScratch& scratch, std::vector<scalar_t>& sorted) {
  const int64_t n = hi - lo;
  sorted.resize(n);
  if (std::is_same<scalar_t, float>::value && n < (int64_t(1) << 32)) {
    auto& buf = scratch.packed;
    buf.resize(n);
    for (int64_t i = 0; i < n; ++i)
      buf[i] = (static_cast<uint64_t>(sort_key(x[lo + i])) << 32) | static_cast<uint64_t>(i);
    std::sort(buf.begin(), buf.end());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src = lo + static_cast<int64_t>(buf[i] & 0xffffffffull);
      perm[lo + i] = src;
      sorted[i] = x[src];
    }
    return;
  }
  auto& buf = scratch.pairs;
  buf.resize(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = {static_cast<uint64_t>(sort_key(x[lo + i])), lo + i};
  std::sort(buf.begin(), buf.end());
  for (int64_t i = 0; i < n; ++i) {
    perm[lo + i] = buf[i].second;
    sorted[i] = x[buf[i].second];
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> w2_forward_cpu(const at::Tensor& u,
                                                               const at::Tensor& v,
                                                               const at::Tensor& u_offsets,
                                                               const at::Tensor& v_offsets,
                                                               int64_t max_seqlen) {
  check_w2_inputs(u, v, u_offsets, v_offsets, "wasserstein2_1d");
  const int64_t S = u_offsets.numel() - 1;
  auto w2 = at::empty({S}, u.options());
  auto u_perm = at::empty({u.numel()}, u.options().dtype(at::kLong));
  auto v_perm = at::empty({v.numel()}, v.options().dtype(at::kLong));
  const int64_t* uo = u_offsets.data_ptr<int64_t>();
  const int64_t* vo = v_offsets.data_ptr<int64_t>();
  const int64_t Nu = u.numel(), Nv = v.numel();

  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "wasserstein2_1d_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* up = u.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    int64_t* upp = u_perm.data_ptr<int64_t>();
    int64_t* vpp = v_perm.data_ptr<int64_t>();
    scalar_t* out = w2.data_ptr<scalar_t>();
    at::parallel_for(0, S, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> a, b;
      SortScratch buf;
      for (int64_t s = begin; s < end; ++s) {
        int64_t ulo, uhi, vlo, vhi;
        segment_bounds(uo, s, Nu, &ulo, &uhi);
        segment_bounds(vo, s, Nv, &vlo, &vhi);
        stable_sort_segment(up, ulo, uhi, upp, buf, a);
        stable_sort_segment(vp, vlo, vhi, vpp, buf, b);
        const int64_t na = uhi - ulo, nb = vhi - vlo;
        if (na == 0 || nb == 0) {  // W2 to an empty distribution is undefined.
          out[s] = std::numeric_limits<scalar_t>::quiet_NaN();
          continue;
        }
        // Drive the walk from the larger side: each of its samples overlaps at most 2 others.
        acc_t total = 0;
        if (na >= nb) {
          for (int64_t i = 0; i < na; ++i) total += w2_row_cost<acc_t>(b.data(), i, acc_t(a[i]), na, nb);
        } else {
          for (int64_t j = 0; j < nb; ++j) total += w2_row_cost<acc_t>(a.data(), j, acc_t(b[j]), nb, na);
        }
        out[s] = static_cast<scalar_t>(total / (static_cast<acc_t>(na) * static_cast<acc_t>(nb)));
      }
    });
  });
  return {w2, u_perm, v_perm};
}

std::tuple<at::Tensor, at::Tensor> w2_backward_cpu(const at::Tensor& grad, const at::Tensor& u,
                                                   const at::Tensor& v, const at::Tensor& u_offsets,
                                                   const at::Tensor& v_offsets,
                                                   const at::Tensor& u_perm,
                                                   const at::Tensor& v_perm) {
  check_w2_backward_inputs(grad, u, v, u_offsets, v_offsets, u_perm, v_perm);
  const int64_t S = u_offsets.numel() - 1;
  auto gu = at::zeros_like(u);
  auto gv = at::zeros_like(v);
  const int64_t* uo = u_offsets.data_ptr<int64_t>();
  const int64_t* vo = v_offsets.data_ptr<int64_t>();
  const int64_t Nu = u.numel(), Nv = v.numel();

  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "wasserstein2_1d_backward_cpu", [&] {
    using acc_t = at::acc_type<scalar_t, /*is_cuda=*/false>;
    const scalar_t* up = u.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    const int64_t* upp = u_perm.data_ptr<int64_t>();
    const int64_t* vpp = v_perm.data_ptr<int64_t>();
    scalar_t* gup = gu.data_ptr<scalar_t>();
    scalar_t* gvp = gv.data_ptr<scalar_t>();
    at::parallel_for(0, S, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> a, b;
      for (int64_t s = begin; s < end; ++s) {
        int64_t ulo, uhi, vlo, vhi;
        segment_bounds(uo, s, Nu, &ulo, &uhi);
        segment_bounds(vo, s, Nv, &vlo, &vhi);
        const int64_t na = uhi - ulo, nb = vhi - vlo;
        if (na == 0 || nb == 0) continue;  // undefined value, zero gradient
        a.resize(na);
        b.resize(nb);
        for (int64_t i = 0; i < na; ++i) a[i] = up[upp[ulo + i]];
        for (int64_t j = 0; j < nb; ++j) b[j] = vp[vpp[vlo + j]];
        const acc_t scale = acc_t(2) * static_cast<acc_t>(gp[s]) /
                            (static_cast<acc_t>(na) * static_cast<acc_t>(nb));
        // The sort permutation is a bijection: each write below hits a distinct element.
        for (int64_t i = 0; i < na; ++i)
          gup[upp[ulo + i]] = static_cast<scalar_t>(scale * w2_row_grad<acc_t>(b.data(), i, acc_t(a[i]), na, nb));
        for (int64_t j = 0; j < nb; ++j)
          gvp[vpp[vlo + j]] = static_cast<scalar_t>(scale * w2_row_grad<acc_t>(a.data(), j, acc_t(b[j]), nb, na));
      }
    });
  });
  return {gu, gv};
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CPU, m) {
  m.impl("wasserstein2_1d", &w2_forward_cpu);
  m.impl("wasserstein2_1d_backward", &w2_backward_cpu);
}

}  // namespace entangle_ext
