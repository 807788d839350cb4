// CPU implementations of the projection operators (docs/algorithm.md §5): the fused
// project_orthogonal (flat) / project_orthogonal_ (in place over a tensor list), and the split
// passes projection_gram, projection_solve and projection_apply_ for sharded gradients.
//
// The tensors are walked in place (no flattening copies), in chunks of kCpuChunk elements grouped
// exactly as the CUDA launches group them (projection.h: proj_plan_groups, proj_locate_segment):
//  pass 1: each chunk forms the float64 Gram of [V; g] in its own slot; the slots are summed in
//          chunk order, so the result does not depend on the number of threads;
//  rescue: float64 inputs whose squares under- or overflow are rescaled by powers of two per row
//          (one max-abs pass and pass 1 again; projection.h), so any finite input projects right;
//  solve:  the float64 k x k solve of projection.h (equilibrated Jacobi, rcond, ridge shift);
//  pass 2: out = g - V^T c in float64, rounded once, chunks in reverse order (cache reuse).
// The inner loops are the vectorised kernels of projection_vec_*.cpp, chosen once per process by
// the CPU capability torch dispatches on.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "../projection.h"
#include "projection_vec.h"

namespace entangle_ext {
namespace {

constexpr int64_t kCpuChunk = int64_t(1) << 15;  // elements per chunk (and reduction slot)

const ProjCpuKernels& cpu_kernels() {
  static const ProjCpuKernels* kernels = [] {
    const std::string cap = at::get_cpu_capability();
    const ProjCpuKernels* k = nullptr;
    if (cap == "AVX512") k = proj_kernels_avx512();
    if (k == nullptr && (cap == "AVX512" || cap == "AVX2")) k = proj_kernels_avx2();
    return k != nullptr ? k : proj_kernels_default();
  }();
  return *kernels;
}

// Raw view of the lists: tensor t of T has numel[t] elements at g[t] / out[t] / v[i * T + t].
struct CpuLists {
  std::vector<const char*> g, v;
  std::vector<char*> out;
  std::vector<int64_t> numel;
  int64_t T = 0;
  int k = 0;
  at::ScalarType dtype = at::kFloat;
  int64_t esize = 4;
};

CpuLists make_lists(at::TensorList grads, at::TensorList basis, int64_t k) {
  CpuLists L;
  L.T = static_cast<int64_t>(grads.size());
  L.k = static_cast<int>(k);
  L.dtype = grads[0].scalar_type();
  L.esize = grads[0].element_size();
  for (const auto& x : grads) {
    L.g.push_back(static_cast<const char*>(x.data_ptr()));
    L.out.push_back(static_cast<char*>(x.data_ptr()));
    L.numel.push_back(x.numel());
  }
  for (const auto& x : basis) L.v.push_back(static_cast<const char*>(x.data_ptr()));
  return L;
}

// fn(slot, chunk) for every chunk, in parallel; slot is the chunk's global index (fixed by the
// shapes). reverse: visit the groups and the chunks within each group from last to first.
template <typename Fn>
int64_t for_each_chunk(const CpuLists& L, bool reverse, const Fn& fn) {
  const auto groups = proj_plan_groups(L.numel, proj_group_capacity(proj_kmax_bucket(L.k)), kCpuChunk);
  std::vector<int64_t> base(groups.size() + 1, 0);
  for (size_t q = 0; q < groups.size(); ++q) base[q + 1] = base[q] + groups[q].nchunks();
  for (size_t qq = 0; qq < groups.size(); ++qq) {
    const size_t q = reverse ? groups.size() - 1 - qq : qq;
    const ProjGroup& grp = groups[q];
    const int nseg = static_cast<int>(grp.tensors.size());
    const int64_t n = grp.nchunks();
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t c = reverse ? proj_reverse(i, n) : i;
        const int s = proj_locate_segment(grp.chunk_prefix.data(), nseg, c);
        const int64_t t = grp.tensors[s];
        int64_t start, len;
        proj_chunk_span(L.numel[t], c - grp.chunk_prefix[s], kCpuChunk, &start, &len);
        const int64_t off = start * L.esize;
        ProjChunk ch{};
        for (int r = 0; r < L.k; ++r) ch.v[r] = L.v[r * L.T + t] + off;
        ch.g = L.g[t] + off;
        ch.out = L.out[t] + off;
        ch.n = len;
        ch.k = L.k;
        fn(base[q] + c, ch);
      }
    });
  }
  return base.back();
}

int64_t total_chunks(const CpuLists& L) {
  int64_t n = 0;
  for (int64_t x : L.numel) n += proj_num_chunks(x, kCpuChunk);
  return n;
}

// Pass 1 over every chunk; returns the accumulators (proj_num_acc(k), layout of projection.h).
std::vector<double> gram_total(const CpuLists& L, const double* scale) {
  const int M = proj_num_acc(L.k);
  const auto& kern = cpu_kernels();
  std::vector<double> partial(static_cast<size_t>(total_chunks(L)) * M, 0.0);
  const int64_t nslots = for_each_chunk(L, false, [&](int64_t slot, const ProjChunk& ch) {
    kern.pass1(L.dtype, ch, scale, partial.data() + slot * M);
  });
  std::vector<double> total(M, 0.0);
  for (int64_t s = 0; s < nslots; ++s)
    for (int m = 0; m < M; ++m) total[m] += partial[s * M + m];
  return total;
}

// Power-of-two scales (k + 1: basis rows, then g) from the max |row| over every chunk.
std::vector<double> row_scales(const CpuLists& L) {
  const int R = L.k + 1;
  const auto& kern = cpu_kernels();
  std::vector<double> partial(static_cast<size_t>(total_chunks(L)) * R, 0.0);
  const int64_t nslots = for_each_chunk(L, false, [&](int64_t slot, const ProjChunk& ch) {
    kern.absmax(L.dtype, ch, partial.data() + slot * R);
  });
  std::vector<double> scale(R, 0.0);
  for (int64_t s = 0; s < nslots; ++s)
    for (int r = 0; r < R; ++r) {
      const double x = partial[s * R + r];
      if (x != x || x > scale[r]) scale[r] = x;
    }
  for (int r = 0; r < R; ++r) scale[r] = proj_pow2_scale(scale[r]);
  return scale;
}

void apply_all(const CpuLists& L, const double* c, const double* scale) {
  const auto& kern = cpu_kernels();
  for_each_chunk(L, true, [&](int64_t, const ProjChunk& ch) { kern.pass2(L.dtype, ch, c, scale); });
}

// The fused projection: pass 1, rescue if needed (float64), solve, pass 2. Returns c (k,) float64.
at::Tensor project_core_cpu(const CpuLists& L, double rcond, double shift, const at::TensorOptions& opts) {
  const int k = L.k;
  std::vector<double> acc = gram_total(L, nullptr);
  std::vector<double> scale;
  if (L.dtype == at::kDouble && proj_needs_rescue(acc.data(), k, k)) {
    scale = row_scales(L);
    acc = gram_total(L, scale.data());
  }
  const double* sp = scale.empty() ? nullptr : scale.data();
  double c_apply[kProjMaxK], c_user[kProjMaxK];
  proj_finish(acc.data(), k, k, rcond, shift, sp, c_apply, c_user);
  apply_all(L, c_apply, sp);
  auto coeffs = at::empty({k}, opts.dtype(at::kDouble));
  std::copy(c_user, c_user + k, coeffs.data_ptr<double>());
  return coeffs;
}

std::tuple<at::Tensor, at::Tensor> project_orthogonal_cpu(const at::Tensor& g, const at::Tensor& basis,
                                                          std::optional<double> rcond, double ridge) {
  const ProjCall c = check_project_flat_call(g, basis, rcond, ridge, "project_orthogonal");
  auto out = at::empty_like(g);
  CpuLists L = make_lists({g}, proj_basis_rows(basis), c.k);
  L.out[0] = static_cast<char*>(out.data_ptr());
  auto coeffs = project_core_cpu(L, c.rcond, c.shift, g.options());
  return {out, coeffs};
}

at::Tensor project_orthogonal_inplace_cpu(at::TensorList grads, at::TensorList basis,
                                          std::optional<double> rcond, double ridge) {
  const ProjCall c = check_project_lists_call(grads, basis, rcond, ridge, "project_orthogonal_");
  return project_core_cpu(make_lists(grads, basis, c.k), c.rcond, c.shift, grads[0].options());
}

std::tuple<at::Tensor, at::Tensor> projection_gram_cpu(at::TensorList grads, at::TensorList basis,
                                                       const std::optional<at::Tensor>& scale) {
  const int64_t k = check_projection_gram_call(grads, basis, scale, "projection_gram");
  const auto acc = gram_total(make_lists(grads, basis, k), proj_scale_ptr(scale));
  auto opts = grads[0].options().dtype(at::kDouble);
  auto G = at::empty({k, k}, opts), b = at::empty({k}, opts);
  double* Gp = G.data_ptr<double>();
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j <= i; ++j) Gp[i * k + j] = Gp[j * k + i] = acc[tri_index(i, j)];
    b.data_ptr<double>()[i] = acc[tri_index(k, i)];
  }
  return {G, b};
}

void projection_apply_cpu(at::TensorList grads, at::TensorList basis, const at::Tensor& coeffs,
                          const std::optional<at::Tensor>& scale) {
  const int64_t k = check_projection_apply_call(grads, basis, coeffs, scale, "projection_apply_");
  apply_all(make_lists(grads, basis, k), coeffs.data_ptr<double>(), proj_scale_ptr(scale));
}

at::Tensor projection_solve_cpu(const at::Tensor& gram, const at::Tensor& vg,
                                std::optional<double> rcond, double shift) {
  const char* op = "projection_solve";
  const int64_t k = check_projection_solve(gram, vg, shift, op);
  const double rc = resolve_rcond(rcond, op);
  double packed[proj_num_acc(kProjMaxK)] = {}, sh[kProjMaxK] = {};
  const double* G = gram.data_ptr<double>();
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j <= i; ++j) packed[tri_index(i, j)] = G[i * k + j];
    sh[i] = shift;
  }
  auto c = at::empty({k}, vg.options());
  solve_projection_coeffs(packed, vg.data_ptr<double>(), static_cast<int>(k), rc, sh, c.data_ptr<double>());
  return c;
}

}  // namespace

// Name of the CPU kernel variant in use ("avx512", "avx2" or "default"), for benchmarks and tests.
const char* projection_cpu_kernel_name() { return cpu_kernels().name; }

TORCH_LIBRARY_IMPL(entangle_ext, CPU, m) {
  m.impl("project_orthogonal", &project_orthogonal_cpu);
  m.impl("project_orthogonal_", &project_orthogonal_inplace_cpu);
  m.impl("projection_gram", &projection_gram_cpu);
  m.impl("projection_apply_", &projection_apply_cpu);
  m.impl("projection_solve", &projection_solve_cpu);
}

}  // namespace entangle_ext
