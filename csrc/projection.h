// Shared pieces of the low-rank orthogonal projection operators (CPU and CUDA): limits, the
// accumulator layout, the float64 k x k solve, the extreme-scale rescue rule and the chunk index
// logic of the multi-tensor kernels. Everything marked ENTANGLE_HD runs on the host and inside
// CUDA kernels, so the CPU tests exercise the same code the GPU runs.
//
// Math (docs/algorithm.md §5, Prop. 4.1): out = g - V^T c,  c = (V V^T + shift I)^+ V g.
// The solve works on the equilibrated Gram C = S (G + shift I) S, S = diag(1/sqrt(G_ii + shift))
// (zero rows get S_ii = 0), so the result does not depend on the scale of the basis rows:
//   C = Q diag(w) Q^T,  keep w_m > rcond * max(w),  y = Q_kept diag(1/w_kept) Q_kept^T (S V g),
//   c = S y.
// With shift = 0, V^T c is the orthogonal projection of g onto the span of the rows kept, identical
// to pinv(C, rtol=rcond, hermitian=True). Zero, duplicated and near-collinear rows (1 - |cos| below
// ~rcond) never produce NaN/Inf or an amplified update.
#pragma once

#include "common.h"
#include "overlap.h"

#include <math.h>

#include <cmath>
#include <optional>
#include <vector>

namespace entangle_ext {

constexpr int kProjMaxK = 8;                // largest number of basis vectors
constexpr double kProjDefaultRcond = 1e-7;  // default relative eigenvalue cutoff of C
// A float64 Gram diagonal (or g.g) outside [kProjRescueLo, DBL_MAX] means squares under- or
// overflowed (rows of magnitude <~1e-145 or >~1e154): the rows are rescaled by powers of two and
// the Gram is formed again. float32/float16/bfloat16 inputs never reach these magnitudes.
constexpr double kProjRescueLo = 1e-290;
constexpr double kProjDblMax = 1.7976931348623157e308;

// ------------------------------------------------------------------------------------------------
// Accumulator layout. The pass-1 kernels accumulate the packed lower triangle of the (K+1)x(K+1)
// Gram of the rows [v_0, ..., v_{K-1}, g]: entry (i, j), j <= i, at tri_index(i, j). The first
// K(K+1)/2 entries are the packed Gram V V^T, the next K are V g (row K), the last is g.g.
// ------------------------------------------------------------------------------------------------
ENTANGLE_HD constexpr int tri_index(int i, int j) { return i * (i + 1) / 2 + j; }
ENTANGLE_HD constexpr int proj_num_acc(int K) { return (K + 1) * (K + 2) / 2; }
ENTANGLE_HD constexpr int proj_vg_offset(int K) { return K * (K + 1) / 2; }

// Cyclic Jacobi eigen-decomposition of a symmetric n x n matrix (row-major, n <= kProjMaxK).
// On return A's diagonal holds the eigenvalues and Q's columns the eigenvectors. Deterministic:
// a fixed sweep order and a fixed stopping rule.
ENTANGLE_HD void jacobi_eigh(double* A, double* Q, int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) Q[i * n + j] = (i == j) ? 1.0 : 0.0;
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = 0.0, total = 0.0;
    for (int p = 0; p < n; ++p)
      for (int q = 0; q < n; ++q) {
        const double a2 = A[p * n + q] * A[p * n + q];
        total += a2;
        if (p != q) off += a2;
      }
    if (!(off > 1e-34 * total)) break;  // also stops on total == 0 and on NaN
    for (int p = 0; p < n - 1; ++p) {
      for (int q = p + 1; q < n; ++q) {
        const double apq = A[p * n + q];
        if (apq == 0.0) continue;
        const double theta = (A[q * n + q] - A[p * n + p]) / (2.0 * apq);
        double t;
        if (::fabs(theta) > 1e150) {
          t = 0.5 / theta;
        } else {
          t = 1.0 / (::fabs(theta) + ::sqrt(theta * theta + 1.0));
          if (theta < 0.0) t = -t;
        }
        const double c = 1.0 / ::sqrt(t * t + 1.0), s = t * c;
        for (int r = 0; r < n; ++r) {  // columns p, q:  A <- A J
          const double arp = A[r * n + p], arq = A[r * n + q];
          A[r * n + p] = c * arp - s * arq;
          A[r * n + q] = s * arp + c * arq;
        }
        for (int r = 0; r < n; ++r) {  // rows p, q:  A <- J^T A
          const double apr = A[p * n + r], aqr = A[q * n + r];
          A[p * n + r] = c * apr - s * aqr;
          A[q * n + r] = s * apr + c * aqr;
        }
        A[p * n + q] = 0.0;
        A[q * n + p] = 0.0;
        for (int r = 0; r < n; ++r) {  // Q <- Q J
          const double qrp = Q[r * n + p], qrq = Q[r * n + q];
          Q[r * n + p] = c * qrp - s * qrq;
          Q[r * n + q] = s * qrp + c * qrq;
        }
      }
    }
  }
}

// The one solve of every projection operator: c (k,) from the packed lower triangle of the Gram
// (gram, tri_index layout of k rows), vg = V g (k,) and a per-row diagonal shift (nullptr: none).
// See the header comment. A non-finite or non-positive shifted diagonal drops the row (c_i = 0).
ENTANGLE_HD void solve_projection_coeffs(const double* gram, const double* vg, int k, double rcond,
                                         const double* shift, double* c) {
  // Non-finite data (NaN/Inf in the Gram or in V·g) give NaN coefficients: dropping such rows as
  // rank-deficient would return a finite, wrong projection. Checked here, on the device, no sync.
  bool finite = true;
  for (int i = 0; i < k; ++i) {
    finite = finite && ::fabs(vg[i]) <= kProjDblMax;
    for (int j = 0; j <= i; ++j) finite = finite && ::fabs(gram[tri_index(i, j)]) <= kProjDblMax;
  }
  if (!finite) {
    for (int i = 0; i < k; ++i) c[i] = ::nan("");
    return;
  }
  double C[kProjMaxK * kProjMaxK];
  double Q[kProjMaxK * kProjMaxK];
  double s[kProjMaxK], bs[kProjMaxK], d[kProjMaxK];
  for (int i = 0; i < k; ++i) {
    d[i] = gram[tri_index(i, i)] + (shift != nullptr ? shift[i] : 0.0);
    s[i] = (d[i] > 0.0 && d[i] <= kProjDblMax) ? 1.0 / ::sqrt(d[i]) : 0.0;
    bs[i] = s[i] * vg[i];
  }
  // C_ii = 1 for a kept row (s_i^2 d_i, exactly); C_ij = (G_ij s_i) s_j in that order, so a tiny
  // Gram (a subnormal diagonal, rows of magnitude ~1e-155) gives no s_i s_j = inf (it gave NaN
  // and the row was dropped).
  for (int i = 0; i < k; ++i)
    for (int j = 0; j <= i; ++j) {
      const double v = (i == j) ? (s[i] > 0.0 ? 1.0 : 0.0) : (gram[tri_index(i, j)] * s[i]) * s[j];
      C[i * k + j] = v;
      C[j * k + i] = v;
    }
  jacobi_eigh(C, Q, k);
  double wmax = 0.0;
  for (int m = 0; m < k; ++m) wmax = C[m * k + m] > wmax ? C[m * k + m] : wmax;
  const double cut = rcond * wmax;
  double y[kProjMaxK];
  for (int i = 0; i < k; ++i) y[i] = 0.0;
  for (int m = 0; m < k; ++m) {
    const double w = C[m * k + m];
    if (!(w > cut) || !(w > 0.0)) continue;
    double proj = 0.0;
    for (int i = 0; i < k; ++i) proj += Q[i * k + m] * bs[i];
    proj /= w;
    for (int i = 0; i < k; ++i) y[i] += Q[i * k + m] * proj;
  }
  for (int i = 0; i < k; ++i) c[i] = s[i] * y[i];
}

// ------------------------------------------------------------------------------------------------
// Extreme scales (float64 inputs). If the unscaled accumulators of K+1 rows (k active) show an
// under- or overflowed square, each row r is multiplied by a power of two scale[r] (scale[k]: g)
// that brings max|row| into [0.5, 1), and the Gram is formed again. Powers of two are exact, and the
// projection is scale-invariant, so nothing else changes.
// ------------------------------------------------------------------------------------------------
ENTANGLE_HD bool proj_in_range(double x) { return x >= kProjRescueLo && x <= kProjDblMax; }

ENTANGLE_HD bool proj_needs_rescue(const double* acc, int K, int k) {
  bool bad = !proj_in_range(acc[tri_index(K, K)]);  // g.g (also catches g == 0: checked once more)
  for (int i = 0; i < k; ++i) {
    bad = bad || !proj_in_range(acc[tri_index(i, i)]);
    bad = bad || !(::fabs(acc[tri_index(K, i)]) <= kProjDblMax);
  }
  return bad;
}

// Power of two s with s * amax in [0.5, 1) (exponent clamped to the normal range); 1 for a zero or
// non-finite amax (a zero row stays zero; non-finite data gives a non-finite result anyway).
ENTANGLE_HD double proj_pow2_scale(double amax) {
  if (!(amax > 0.0) || !(amax <= kProjDblMax)) return 1.0;
  int e = 0;
  ::frexp(amax, &e);
  e = -e;
  e = e < -1022 ? -1022 : (e > 1023 ? 1023 : e);
  return ::ldexp(1.0, e);
}

ENTANGLE_HD int proj_exponent(double pow2) {
  int e = 0;
  ::frexp(pow2, &e);
  return e - 1;
}

// From the accumulators (layout of K+1 rows, k active; scale: k+1 powers of two or nullptr) and the
// diagonal shift of the unscaled Gram: the coefficients pass 2 applies, g -= sum_i c_apply[i] *
// (scale[i] v_i), and the user's coefficients c_user (V^T c_user is the removed component).
ENTANGLE_HD void proj_finish(const double* acc, int K, int k, double rcond, double shift,
                             const double* scale, double* c_apply, double* c_user) {
  double sh[kProjMaxK] = {}, cs[kProjMaxK] = {};
  for (int i = 0; i < k; ++i)
    sh[i] = (scale == nullptr || shift == 0.0) ? shift : ::ldexp(shift, 2 * proj_exponent(scale[i]));
  solve_projection_coeffs(acc, acc + proj_vg_offset(K), k, rcond, sh, cs);
  const int eg = scale == nullptr ? 0 : proj_exponent(scale[k]);
  for (int i = 0; i < k; ++i) {
    c_apply[i] = scale == nullptr ? cs[i] : ::ldexp(cs[i], -eg);
    c_user[i] = scale == nullptr ? cs[i] : ::ldexp(cs[i], proj_exponent(scale[i]) - eg);
  }
}

// ------------------------------------------------------------------------------------------------
// Chunk index logic of the multi-tensor kernels. The non-empty tensors are packed, in order, into
// groups of at most `capacity` tensors (one kernel-argument struct / launch on CUDA); each tensor is
// cut into chunks of `chunk` elements; chunk_prefix[s] is the first group-local chunk of segment s
// (chunk_prefix[nseg] = chunks in the group). Reductions write one slot per chunk (CPU) or per
// block (CUDA) in a fixed order, so results do not depend on the thread count.
// ------------------------------------------------------------------------------------------------
ENTANGLE_HD int64_t proj_num_chunks(int64_t numel, int64_t chunk) { return (numel + chunk - 1) / chunk; }

// The segment s of group-local chunk c: the largest s with chunk_prefix[s] <= c (binary search).
ENTANGLE_HD int proj_locate_segment(const int64_t* chunk_prefix, int nseg, int64_t c) {
  int lo = 0, hi = nseg - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunk_prefix[mid] <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// First element and length of chunk `local` (0-based within its tensor) of a tensor of numel.
ENTANGLE_HD void proj_chunk_span(int64_t numel, int64_t local, int64_t chunk, int64_t* start,
                                 int64_t* len) {
  *start = local * chunk;
  *len = (numel - *start) < chunk ? (numel - *start) : chunk;
}

// Pass 2 visits chunks in reverse order: what pass 1 read last is still in the cache (L2/L3).
ENTANGLE_HD int64_t proj_reverse(int64_t i, int64_t n) { return n - 1 - i; }

// Tensors per group for a basis bucket of KMAX vectors: the CUDA argument struct holds, per tensor,
// KMAX + 2 pointers (basis, g, out), numel, the chunk prefix and an alignment flag, plus one more
// prefix entry, within 3,840 bytes (under the 4 KiB kernel-parameter limit).
ENTANGLE_HD constexpr int proj_group_capacity(int kmax) { return (3840 - 8) / ((kmax + 4) * 8 + 1); }
ENTANGLE_HD constexpr int proj_kmax_bucket(int k) { return k <= 2 ? 2 : (k <= 4 ? 4 : kProjMaxK); }

struct ProjGroup {
  std::vector<int64_t> tensors;       // indices into the caller's tensor list (non-empty only)
  std::vector<int64_t> chunk_prefix;  // tensors.size() + 1 entries
  int64_t nchunks() const { return chunk_prefix.back(); }
};

inline std::vector<ProjGroup> proj_plan_groups(const std::vector<int64_t>& numels, int capacity,
                                               int64_t chunk) {
  std::vector<ProjGroup> groups;
  for (int64_t t = 0; t < static_cast<int64_t>(numels.size()); ++t) {
    if (numels[t] == 0) continue;
    if (groups.empty() || static_cast<int>(groups.back().tensors.size()) == capacity) {
      groups.emplace_back();
      groups.back().chunk_prefix.push_back(0);
    }
    ProjGroup& g = groups.back();
    g.tensors.push_back(t);
    g.chunk_prefix.push_back(g.chunk_prefix.back() + proj_num_chunks(numels[t], chunk));
  }
  return groups;
}

// ------------------------------------------------------------------------------------------------
// Argument checks (ValueError / TypeError in Python); host only.
// ------------------------------------------------------------------------------------------------
inline bool proj_dtype_ok(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

inline double resolve_rcond(std::optional<double> rcond, const char* op) {
  const double r = rcond.has_value() ? *rcond : kProjDefaultRcond;
  TORCH_CHECK_VALUE(std::isfinite(r) && r >= 1e-15 && r < 1.0, op,
                    ": rcond must be in [1e-15, 1), got ", r);
  return r;
}

inline void check_ridge(double ridge, const char* op, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(ridge) && ridge >= 0.0, op, ": ", name,
                    " must be finite and >= 0, got ", ridge);
}

// Same element order in memory: same sizes, and the same strides on every dimension of size > 1.
inline bool proj_same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

// grads: T tensors; basis: k*T tensors, row-major by basis vector (basis[i*T + t] pairs with
// grads[t]). Every tensor is dense and non-overlapping (any memory format) and each basis tensor has
// the memory layout of its gradient, so the kernels walk them in one element order. Returns k.
inline int64_t check_projection_lists(at::TensorList grads, at::TensorList basis, const char* op) {
  const int64_t T = static_cast<int64_t>(grads.size());
  TORCH_CHECK_VALUE(T > 0, op, ": grads must be a non-empty list of tensors");
  TORCH_CHECK_VALUE(basis.size() > 0 && basis.size() % T == 0, op, ": basis must hold k * ",
                    T, " tensors (k lists matching grads tensor by tensor), got ", basis.size());
  const int64_t k = static_cast<int64_t>(basis.size()) / T;
  TORCH_CHECK_VALUE(k >= 1 && k <= kProjMaxK, op, ": the number of basis vectors k must be in [1, ",
                    kProjMaxK, "], got ", k);
  const at::Tensor& g0 = grads[0];
  TORCH_CHECK_TYPE(proj_dtype_ok(g0.scalar_type()), op,
                   ": tensors must be float32, float64, float16 or bfloat16, got ", dtype_name(g0));
  for (int64_t t = 0; t < T; ++t) {
    const at::Tensor& g = grads[t];
    TORCH_CHECK_TYPE(g.scalar_type() == g0.scalar_type(), op, ": grads[", t, "] is ",
                     dtype_name(g), " but grads[0] is ", dtype_name(g0),
                     "; all tensors must share one dtype");
    TORCH_CHECK_VALUE(g.device() == g0.device(), op, ": grads[", t, "] is on ", g.device(),
                      " but grads[0] is on ", g0.device());
    TORCH_CHECK_VALUE(g.is_non_overlapping_and_dense(), op, ": grads[", t, "] (shape ", shape_str(g),
                      ", strides ", g.strides(), ") is not dense and non-overlapping (an expanded, "
                      "strided or sliced view); pass a tensor that owns its memory");
    for (int64_t i = 0; i < k; ++i) {
      const at::Tensor& v = basis[i * T + t];
      TORCH_CHECK_TYPE(v.scalar_type() == g0.scalar_type(), op, ": basis[", i, "][", t, "] is ",
                       dtype_name(v), " but grads are ", dtype_name(g0));
      TORCH_CHECK_VALUE(v.device() == g0.device(), op, ": basis[", i, "][", t, "] is on ",
                        v.device(), " but grads are on ", g0.device());
      TORCH_CHECK_VALUE(v.sizes() == g.sizes(), op, ": basis[", i, "][", t, "] has shape ",
                        shape_str(v), " but grads[", t, "] has shape ", shape_str(g));
      TORCH_CHECK_VALUE(v.is_non_overlapping_and_dense() && proj_same_layout(v, g), op, ": basis[",
                        i, "][", t, "] (strides ", v.strides(), ") does not share the memory layout "
                        "of grads[", t, "] (strides ", g.strides(), "); give both the same layout, "
                        "e.g. torch.empty_like(grad) or .contiguous() on both");
    }
  }
  return k;
}

inline int64_t check_projection_flat(const at::Tensor& g, const at::Tensor& basis, const char* op) {
  check_dim(g, 1, op, "g");
  check_dim(basis, 2, op, "basis");
  TORCH_CHECK_TYPE(proj_dtype_ok(g.scalar_type()), op,
                   ": g must be float32, float64, float16 or bfloat16, got ", dtype_name(g));
  TORCH_CHECK_TYPE(basis.scalar_type() == g.scalar_type(), op, ": basis is ", dtype_name(basis),
                   " but g is ", dtype_name(g));
  check_same_device(g, basis, op, "g", "basis");
  TORCH_CHECK_VALUE(basis.size(1) == g.size(0), op, ": basis has shape ", shape_str(basis),
                    " but g has ", g.size(0), " elements; expected (k, ", g.size(0), ")");
  const int64_t k = basis.size(0);
  TORCH_CHECK_VALUE(k >= 1 && k <= kProjMaxK, op, ": the number of basis vectors k must be in [1, ",
                    kProjMaxK, "], got ", k);
  check_contiguous(g, op, "g");
  check_contiguous(basis, op, "basis");
  return k;
}

// ------------------------------------------------------------------------------------------------
// The argument handling every device's operator shares (host only): the checks of each call, the
// rows of a flat basis, the ridge shift, the optional scale.
// ------------------------------------------------------------------------------------------------
struct ProjCall {
  int64_t k;      // number of basis vectors
  double rcond;   // resolved relative cutoff (kProjDefaultRcond when not given)
  double shift;   // ridge added to the Gram diagonal: once per parameter tensor
};

// The k rows of a (k, P) basis as the list form's k lists of one (P,) tensor each (views).
inline std::vector<at::Tensor> proj_basis_rows(const at::Tensor& basis) {
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < basis.size(0); ++i) rows.push_back(basis.select(0, i));
  return rows;
}

// The float64 entries of an optional scale vector, or nullptr.
inline const double* proj_scale_ptr(const std::optional<at::Tensor>& scale) {
  return scale.has_value() ? scale->data_ptr<double>() : nullptr;
}

// coeffs (k,) float64 (and an optional scale of n entries) on the device of the data.
inline void check_proj_vector(const at::Tensor& x, int64_t n, const at::Device& dev, const char* op,
                              const char* name) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kDouble, op, ": ", name, " must be float64, got ",
                   dtype_name(x));
  TORCH_CHECK_VALUE(x.dim() == 1 && x.size(0) == n, op, ": ", name, " must have shape (", n,
                    ",), got ", shape_str(x));
  TORCH_CHECK_VALUE(x.device() == dev, op, ": ", name, " is on ", x.device(),
                    " but the tensors are on ", dev);
  check_contiguous(x, op, name);
}

inline int64_t check_projection_solve(const at::Tensor& gram, const at::Tensor& vg, double shift,
                                      const char* op) {
  check_dim(gram, 2, op, "gram");
  const int64_t k = gram.size(0);
  TORCH_CHECK_VALUE(gram.size(1) == k && k >= 1 && k <= kProjMaxK, op,
                    ": gram must be (k, k) with k in [1, ", kProjMaxK, "], got ", shape_str(gram));
  TORCH_CHECK_TYPE(gram.scalar_type() == at::kDouble, op, ": gram must be float64, got ",
                   dtype_name(gram));
  check_contiguous(gram, op, "gram");
  check_proj_vector(vg, k, gram.device(), op, "vg");
  check_ridge(shift, op, "shift");
  return k;
}

// project_orthogonal(g, basis, rcond, ridge): g (P,), basis (k, P); one tensor, so shift = ridge.
inline ProjCall check_project_flat_call(const at::Tensor& g, const at::Tensor& basis,
                                        std::optional<double> rcond, double ridge, const char* op) {
  const int64_t k = check_projection_flat(g, basis, op);
  const double rc = resolve_rcond(rcond, op);
  check_ridge(ridge, op, "ridge");
  return {k, rc, ridge};
}

// project_orthogonal_(grads, basis, rcond, ridge): T tensors, so shift = T * ridge.
inline ProjCall check_project_lists_call(at::TensorList grads, at::TensorList basis,
                                         std::optional<double> rcond, double ridge, const char* op) {
  const int64_t k = check_projection_lists(grads, basis, op);
  const double rc = resolve_rcond(rcond, op);
  check_ridge(ridge, op, "ridge");
  check_inplace_disjoint(op, {{grads, "grads", true, true}, {basis, "basis", true, false}});
  return {k, rc, ridge * static_cast<double>(grads.size())};
}

// projection_gram(grads, basis, scale): scale, when given, is (k + 1,) float64. Returns k.
inline int64_t check_projection_gram_call(at::TensorList grads, at::TensorList basis,
                                          const std::optional<at::Tensor>& scale, const char* op) {
  const int64_t k = check_projection_lists(grads, basis, op);
  if (scale.has_value()) check_proj_vector(*scale, k + 1, grads[0].device(), op, "scale");
  return k;
}

// projection_apply_(grads, basis, coeffs, scale): coeffs and scale (when given) (k,) float64.
inline int64_t check_projection_apply_call(at::TensorList grads, at::TensorList basis,
                                           const at::Tensor& coeffs,
                                           const std::optional<at::Tensor>& scale, const char* op) {
  const int64_t k = check_projection_lists(grads, basis, op);
  check_proj_vector(coeffs, k, grads[0].device(), op, "coeffs");
  if (scale.has_value()) check_proj_vector(*scale, k, grads[0].device(), op, "scale");
  const at::Tensor none;
  check_inplace_disjoint(op, {{grads, "grads", true, true}, {basis, "basis", true, false},
                              {at::TensorList(coeffs), "coeffs", false, false},
                              {at::TensorList(scale.has_value() ? *scale : none), "scale", false, false}});
  return k;
}

}  // namespace entangle_ext
