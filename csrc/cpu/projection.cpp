// CPU kernels of entangle_ext::project_orthogonal (flat) and project_orthogonal_ (in place over a
// tensor list): out = g - V^T c, c = (V V^T)^+ V g with a relative eigenvalue cutoff.
//
// Two passes over fixed chunks of every tensor (no flattening copies):
//  pass 1: each chunk converts its slice of g and of the k basis vectors to float64 in small
//          blocks and forms the k(k+1)/2 Gram entries and the k dot products v_i . g; the chunk
//          writes them to its own slot, and the slots are summed in a fixed order (the result
//          does not depend on the number of threads);
//  solve:  float64 k x k solve with the equilibrated Jacobi pseudo-inverse of projection.h;
//  pass 2: out = g - sum_i c_i v_i, computed in float64 and rounded once to the tensor dtype.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "../projection.h"

namespace entangle_ext {
namespace {

constexpr int64_t kCpuChunk = int64_t(1) << 15;  // elements per reduction slot
constexpr int64_t kCpuBlock = 256;               // elements converted to float64 at a time

template <typename T>
inline double to_d(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
inline double to_d<double>(double x) {
  return x;
}
template <>
inline double to_d<float>(float x) {
  return static_cast<double>(x);
}

// Fixed-order dot product of two float64 blocks (8 independent lanes, so the compiler vectorises).
inline double dot_block(const double* a, const double* b, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t e = 0;
  for (; e + 8 <= n; e += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[e + l] * b[e + l];
  for (int l = 0; e < n; ++e, ++l) acc[l] += a[e] * b[e];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

struct WorkItem {
  int64_t t;      // tensor index
  int64_t start;  // first element of the chunk
  int64_t len;    // elements in the chunk
};

template <typename T>
at::Tensor project_core_cpu(const std::vector<at::Tensor>& gs, const std::vector<at::Tensor>& outs,
                            at::TensorList basis, int64_t k, double rcond) {
  const int64_t T_ = static_cast<int64_t>(gs.size());
  const int K = static_cast<int>(k);
  const int M = proj_num_acc(K);
  std::vector<WorkItem> items;
  for (int64_t t = 0; t < T_; ++t) {
    const int64_t n = gs[t].numel();
    for (int64_t s = 0; s < n; s += kCpuChunk) items.push_back({t, s, std::min(kCpuChunk, n - s)});
  }
  const int64_t nitems = static_cast<int64_t>(items.size());
  std::vector<const T*> gp(T_), vp(T_ * k);
  std::vector<T*> op(T_);
  for (int64_t t = 0; t < T_; ++t) {
    gp[t] = gs[t].data_ptr<T>();
    op[t] = outs[t].data_ptr<T>();
    for (int64_t i = 0; i < k; ++i) vp[i * T_ + t] = basis[i * T_ + t].data_ptr<T>();
  }

  // ---- pass 1: per-chunk partial sums ---------------------------------------------------------
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(nitems, 1)) * M, 0.0);
  at::parallel_for(0, nitems, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> buf((k + 1) * kCpuBlock);
    double* xg = buf.data() + k * kCpuBlock;
    for (int64_t w = begin; w < end; ++w) {
      const WorkItem& it = items[w];
      double* acc = partial.data() + w * M;
      for (int64_t b0 = 0; b0 < it.len; b0 += kCpuBlock) {
        const int64_t n = std::min(kCpuBlock, it.len - b0);
        const int64_t off = it.start + b0;
        const T* g = gp[it.t] + off;
        for (int64_t e = 0; e < n; ++e) xg[e] = to_d(g[e]);
        for (int64_t i = 0; i < k; ++i) {
          const T* v = vp[i * T_ + it.t] + off;
          double* xi = buf.data() + i * kCpuBlock;
          for (int64_t e = 0; e < n; ++e) xi[e] = to_d(v[e]);
        }
        for (int i = 0; i < K; ++i) {
          const double* xi = buf.data() + i * kCpuBlock;
          for (int j = 0; j <= i; ++j) acc[tri_index(i, j)] += dot_block(xi, buf.data() + j * kCpuBlock, n);
          acc[K * (K + 1) / 2 + i] += dot_block(xi, xg, n);
        }
      }
    }
  });
  std::vector<double> total(M, 0.0);
  for (int64_t w = 0; w < nitems; ++w)
    for (int m = 0; m < M; ++m) total[m] += partial[w * M + m];

  // ---- k x k solve ---------------------------------------------------------------------------
  auto coeffs = at::empty({k}, gs[0].options().dtype(at::kDouble));
  double* c = coeffs.data_ptr<double>();
  solve_projection_coeffs(total.data(), K, K, rcond, c);

  // ---- pass 2: out = g - V^T c ----------------------------------------------------------------
  at::parallel_for(0, nitems, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(kCpuBlock);
    for (int64_t w = begin; w < end; ++w) {
      const WorkItem& it = items[w];
      for (int64_t b0 = 0; b0 < it.len; b0 += kCpuBlock) {
        const int64_t n = std::min(kCpuBlock, it.len - b0);
        const int64_t off = it.start + b0;
        const T* g = gp[it.t] + off;
        for (int64_t e = 0; e < n; ++e) acc[e] = to_d(g[e]);
        for (int64_t i = 0; i < k; ++i) {
          const T* v = vp[i * T_ + it.t] + off;
          const double ci = c[i];
          for (int64_t e = 0; e < n; ++e) acc[e] -= ci * to_d(v[e]);
        }
        T* o = op[it.t] + off;
        for (int64_t e = 0; e < n; ++e) o[e] = static_cast<T>(acc[e]);
      }
    }
  });
  return coeffs;
}

at::Tensor dispatch_core(const std::vector<at::Tensor>& gs, const std::vector<at::Tensor>& outs,
                         at::TensorList basis, int64_t k, double rcond) {
  at::Tensor coeffs;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gs[0].scalar_type(),
                                  "project_orthogonal_cpu", [&] {
                                    coeffs = project_core_cpu<scalar_t>(gs, outs, basis, k, rcond);
                                  });
  return coeffs;
}

std::tuple<at::Tensor, at::Tensor> project_orthogonal_cpu(const at::Tensor& g, const at::Tensor& basis,
                                                          double rcond) {
  const int64_t k = check_projection_flat(g, basis, rcond, "project_orthogonal");
  auto out = at::empty_like(g);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < k; ++i) rows.push_back(basis.select(0, i));
  auto coeffs = dispatch_core({g}, {out}, rows, k, rcond);
  return {out, coeffs};
}

at::Tensor project_orthogonal_inplace_cpu(at::TensorList grads, at::TensorList basis, double rcond) {
  const int64_t k = check_projection_lists(grads, basis, rcond, "project_orthogonal_");
  std::vector<at::Tensor> gs(grads.begin(), grads.end());
  return dispatch_core(gs, gs, basis, k, rcond);
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CPU, m) {
  m.impl("project_orthogonal", &project_orthogonal_cpu);
  m.impl("project_orthogonal_", &project_orthogonal_inplace_cpu);
}

}  // namespace entangle_ext
