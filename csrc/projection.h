// Shared pieces of entangle_ext::project_orthogonal / project_orthogonal_ (CPU and CUDA):
// limits, argument checks, the packed Gram layout and the float64 k x k solve with a relative
// eigenvalue cutoff (cyclic Jacobi), usable on the host and inside a CUDA kernel.
//
// Math (method.md Stage 2 step 5, Prop. 4.1): out = g - V^T c,  c = (V V^T)^+ V g.
// The solve is done on the equilibrated Gram C = S G S, S = diag(1/||v_i||) (zero rows get
// S_ii = 0), so the result does not depend on the scale of the basis rows:
//   C = Q diag(w) Q^T,  keep w_m > rcond * max(w),  y = Q_kept diag(1/w_kept) Q_kept^T (S V g),
//   c = S y.
// Then V^T c = (S V)^T C^+ (S V) g is the orthogonal projection of g onto the span of the rows kept,
// identical to pinv(C, rtol=rcond, hermitian=True). Zero rows, duplicated rows and near-collinear
// rows (1 - |cos| below ~rcond) never produce NaN/Inf or an amplified update.
#pragma once

#include "common.h"

#include <math.h>

#include <cmath>
#include <vector>

namespace entangle_ext {

constexpr int kProjMaxK = 8;  // largest number of basis vectors

// Number of float64 accumulators for a basis of (at most) K vectors: the packed lower triangle of
// the Gram (K(K+1)/2 entries, entry (i, j) with j <= i at i(i+1)/2 + j) followed by the K dot
// products v_i . g.
ENTANGLE_HD constexpr int proj_num_acc(int K) { return K * (K + 1) / 2 + K; }
ENTANGLE_HD constexpr int tri_index(int i, int j) { return i * (i + 1) / 2 + j; }

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

// Coefficients c (k,) of the projection from the packed accumulators acc (layout of
// proj_num_acc(K), K >= k: Gram lower triangle then V g). See the header comment.
ENTANGLE_HD void solve_projection_coeffs(const double* acc, int K, int k, double rcond, double* c) {
  double C[kProjMaxK * kProjMaxK];
  double Q[kProjMaxK * kProjMaxK];
  double s[kProjMaxK], bs[kProjMaxK];
  const double* vg = acc + K * (K + 1) / 2;
  for (int i = 0; i < k; ++i) {
    const double d = acc[tri_index(i, i)];
    s[i] = (d > 0.0 && d <= 1.7976931348623157e308) ? 1.0 / ::sqrt(d) : 0.0;
    bs[i] = s[i] * vg[i];
  }
  for (int i = 0; i < k; ++i)
    for (int j = 0; j <= i; ++j) {
      const double v = s[i] * s[j] * acc[tri_index(i, j)];
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
// Argument checks (ValueError / TypeError in Python).
// ------------------------------------------------------------------------------------------------
inline bool proj_dtype_ok(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

inline void check_rcond(double rcond, const char* op) {
  TORCH_CHECK_VALUE(std::isfinite(rcond) && rcond >= 1e-15 && rcond < 1.0, op,
                    ": rcond must be in [1e-15, 1), got ", rcond);
}

// grads: T tensors; basis: k*T tensors, row-major by basis vector (basis[i*T + t] pairs with
// grads[t]). Returns k.
inline int64_t check_projection_lists(at::TensorList grads, at::TensorList basis, double rcond,
                                      const char* op) {
  check_rcond(rcond, op);
  const int64_t T = static_cast<int64_t>(grads.size());
  TORCH_CHECK_VALUE(T > 0, op, ": grads must be a non-empty list of tensors");
  TORCH_CHECK_VALUE(basis.size() > 0 && basis.size() % T == 0, op, ": basis must hold k * ",
                    T, " tensors (k lists matching grads tensor by tensor), got ", basis.size());
  const int64_t k = static_cast<int64_t>(basis.size()) / T;
  TORCH_CHECK_VALUE(k >= 1 && k <= kProjMaxK, op, ": the number of basis vectors k must be in [1, ",
                    kProjMaxK, "], got ", k);
  const at::Tensor& g0 = grads[0];
  TORCH_CHECK_TYPE(proj_dtype_ok(g0.scalar_type()), op,
                   ": tensors must be float32, float64, float16 or bfloat16, got ", g0.scalar_type());
  for (int64_t t = 0; t < T; ++t) {
    const at::Tensor& g = grads[t];
    TORCH_CHECK_TYPE(g.scalar_type() == g0.scalar_type(), op, ": grads[", t, "] is ",
                     g.scalar_type(), " but grads[0] is ", g0.scalar_type(),
                     "; all tensors must share one dtype");
    TORCH_CHECK_VALUE(g.device() == g0.device(), op, ": grads[", t, "] is on ", g.device(),
                      " but grads[0] is on ", g0.device());
    TORCH_CHECK_VALUE(g.is_contiguous(), op, ": grads[", t,
                      "] is not contiguous; pass contiguous tensors (no copies are made)");
    for (int64_t i = 0; i < k; ++i) {
      const at::Tensor& v = basis[i * T + t];
      TORCH_CHECK_TYPE(v.scalar_type() == g0.scalar_type(), op, ": basis[", i, "][", t, "] is ",
                       v.scalar_type(), " but grads are ", g0.scalar_type());
      TORCH_CHECK_VALUE(v.device() == g0.device(), op, ": basis[", i, "][", t, "] is on ",
                        v.device(), " but grads are on ", g0.device());
      TORCH_CHECK_VALUE(v.sizes() == g.sizes(), op, ": basis[", i, "][", t, "] has shape ",
                        v.sizes(), " but grads[", t, "] has shape ", g.sizes());
      TORCH_CHECK_VALUE(v.is_contiguous(), op, ": basis[", i, "][", t,
                        "] is not contiguous; pass contiguous tensors (no copies are made)");
    }
  }
  return k;
}

inline int64_t check_projection_flat(const at::Tensor& g, const at::Tensor& basis, double rcond,
                                     const char* op) {
  check_rcond(rcond, op);
  check_dim(g, 1, op, "g");
  check_dim(basis, 2, op, "basis");
  TORCH_CHECK_TYPE(proj_dtype_ok(g.scalar_type()), op,
                   ": g must be float32, float64, float16 or bfloat16, got ", g.scalar_type());
  TORCH_CHECK_TYPE(basis.scalar_type() == g.scalar_type(), op, ": basis is ", basis.scalar_type(),
                   " but g is ", g.scalar_type());
  check_same_device(g, basis, op, "g", "basis");
  TORCH_CHECK_VALUE(basis.size(1) == g.size(0), op, ": basis has shape ", basis.sizes(),
                    " but g has ", g.size(0), " elements; expected (k, ", g.size(0), ")");
  const int64_t k = basis.size(0);
  TORCH_CHECK_VALUE(k >= 1 && k <= kProjMaxK, op, ": the number of basis vectors k must be in [1, ",
                    kProjMaxK, "], got ", k);
  check_contiguous(g, op, "g");
  check_contiguous(basis, op, "basis");
  return k;
}

}  // namespace entangle_ext
