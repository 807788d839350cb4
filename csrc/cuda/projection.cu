// CUDA kernels of the projection operators (docs/algorithm.md §5): the fused project_orthogonal /
// project_orthogonal_ and the split passes projection_gram / projection_apply_ / projection_solve.
//
// Multi-tensor style: the host packs up to proj_group_capacity(KMAX) tensors (addresses, sizes,
// chunk prefix sums, alignment flags) into a by-value argument struct per launch (projection.h:
// proj_plan_groups); every block grid-strides over the group's chunks of kChunk elements
// (proj_locate_segment finds a chunk's tensor). No flattening copies.
//  pass 1 (proj_pass1_kernel): float64 Gram of [V; g] per thread, then one fixed-order block sum
//         into the block's slot (slot = launch base + block index, fixed by the shapes and GPU);
//  finish (proj_finish_kernel): one block sums the slots in a fixed order and solves the k x k
//         system in float64 (projection.h); float64 inputs whose squares under-/overflow set a
//         device flag that runs the gated max-abs pass, the scales and pass 1 again (rescue);
//  pass 2 (proj_pass2_kernel): out = g - V^T c in float64, one rounding, chunks in reverse order so
//         the first chunks it reads are the L2-resident tail of pass 1.
// Full tiles of aligned tensors use 16-byte vector loads, all (k+1) x unroll issued before the
// arithmetic; the rest of a chunk is scalar. Everything runs on the current stream with no host
// synchronisation (CUDA-graph capturable) and no atomics (bitwise deterministic on one GPU model).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../projection.h"
#include "projection_kernels.cuh"

namespace entangle_ext {
namespace {

// ------------------------------------------------------------------------------------------------
// Host side: pack the lists into launch structs, size the grids, launch on the current stream.
// ------------------------------------------------------------------------------------------------
struct HostLists {
  std::vector<const void*> g, v;  // v: k * T, row-major by basis vector
  std::vector<void*> out;
  std::vector<int64_t> numel;
  int64_t T = 0;
  int k = 0;
};

HostLists make_host_lists(at::TensorList grads, at::TensorList basis, int64_t k) {
  HostLists L;
  L.T = static_cast<int64_t>(grads.size());
  L.k = static_cast<int>(k);
  for (const auto& x : grads) {
    L.g.push_back(x.data_ptr());
    L.out.push_back(x.data_ptr());
    L.numel.push_back(x.numel());
  }
  for (const auto& x : basis) L.v.push_back(x.data_ptr());
  return L;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int KMAX>
std::vector<ProjArgs<KMAX>> build_args(const HostLists& L) {
  const auto groups = proj_plan_groups(L.numel, ProjArgs<KMAX>::NT, kChunk);
  std::vector<ProjArgs<KMAX>> args(groups.size());
  for (size_t q = 0; q < groups.size(); ++q) {
    ProjArgs<KMAX>& a = args[q];
    std::memset(&a, 0, sizeof(a));
    const ProjGroup& grp = groups[q];
    a.nseg = static_cast<int>(grp.tensors.size());
    for (int s = 0; s < a.nseg; ++s) {
      const int64_t t = grp.tensors[s];
      a.g[s] = L.g[t];
      a.out[s] = L.out[t];
      bool al = aligned16(L.g[t]) && aligned16(L.out[t]);
      for (int i = 0; i < KMAX; ++i) {
        a.v[i][s] = i < L.k ? L.v[i * L.T + t] : nullptr;
        if (i < L.k) al = al && aligned16(a.v[i][s]);
      }
      a.numel[s] = L.numel[t];
      a.chunk_prefix[s] = grp.chunk_prefix[s];
      a.aligned[s] = al ? 1 : 0;
    }
    a.chunk_prefix[a.nseg] = grp.chunk_prefix[a.nseg];
  }
  return args;
}

template <typename Kernel>
int blocks_per_sm(Kernel kernel) {
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
  return std::max(n, 1);
}

// Calls launch(args, grid, slot_base) per group (grid = chunks, capped at a full GPU of resident
// blocks; slot_base = sum of the earlier grids). Returns the number of slots. reverse: last first.
template <int KMAX, typename Launch>
int64_t for_each_launch(const std::vector<ProjArgs<KMAX>>& args, int per_sm, bool reverse,
                        Launch&& launch) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int64_t base = 0;
  for (size_t qq = 0; qq < args.size(); ++qq) {
    const size_t q = reverse ? args.size() - 1 - qq : qq;
    const int64_t nchunks = args[q].chunk_prefix[args[q].nseg];
    const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(nchunks, sms * per_sm));
    launch(args[q], static_cast<unsigned>(grid), base);
    base += grid;
  }
  return base;
}

template <int KMAX>
int64_t count_slots(const std::vector<ProjArgs<KMAX>>& args, int per_sm) {
  return for_each_launch<KMAX>(args, per_sm, false, [](const ProjArgs<KMAX>&, unsigned, int64_t) {
  });
}

// Resident blocks per SM of each kernel, queried once per instantiation (host-only, capture-safe).
template <typename T, int KMAX>
int pass1_per_sm(bool scaled) {
  static const int plain = blocks_per_sm(proj_pass1_kernel<T, KMAX, false>);
  static const int with_scale = blocks_per_sm(proj_pass1_kernel<T, KMAX, true>);
  return scaled ? with_scale : plain;
}
template <typename T, int KMAX>
int absmax_per_sm() {
  static const int n = blocks_per_sm(proj_absmax_kernel<T, KMAX>);
  return n;
}
template <typename T, int KMAX>
int pass2_per_sm() {
  static const int n = blocks_per_sm(proj_pass2_kernel<T, KMAX>);
  return n;
}

// Pass 1 over every group into partials (slot width proj_num_acc(KMAX)). Returns the slots.
template <typename T, int KMAX>
int64_t launch_pass1(const std::vector<ProjArgs<KMAX>>& args, int k, const double* scale,
                     const int* gate, double* partials, cudaStream_t stream) {
  const int per_sm = pass1_per_sm<T, KMAX>(scale != nullptr);
  auto launch = [&](const ProjArgs<KMAX>& a, unsigned grid, int64_t base) {
    if (scale != nullptr) {
      proj_pass1_kernel<T, KMAX, true><<<grid, kThreads, 0, stream>>>(a, k, scale, gate, base, partials);
    } else {
      proj_pass1_kernel<T, KMAX, false><<<grid, kThreads, 0, stream>>>(a, k, nullptr, gate, base,
                                                                       partials);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  return for_each_launch<KMAX>(args, per_sm, false, launch);
}

template <typename T, int KMAX>
void launch_pass2(const std::vector<ProjArgs<KMAX>>& args, int k, const double* c,
                  const double* scale, cudaStream_t stream) {
  for_each_launch<KMAX>(args, pass2_per_sm<T, KMAX>(), true,
                        [&](const ProjArgs<KMAX>& a, unsigned grid, int64_t) {
    proj_pass2_kernel<T, KMAX><<<grid, kThreads, 0, stream>>>(a, k, c, scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <int KMAX>
void launch_finish(const double* partials, int64_t nslots, int k, double rcond, double shift,
                   FinishMode mode, Work* work, double* out1, double* out2, cudaStream_t stream) {
  proj_finish_kernel<KMAX><<<1, kThreads, 0, stream>>>(partials, nslots, k, rcond, shift, mode, work,
                                                       out1, out2);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The fused projection; returns c (k,) float64. float64 runs the gated rescue launches too.
template <typename T, int KMAX>
at::Tensor project_core_cuda(const HostLists& L, double rcond, double shift,
                             const at::TensorOptions& opts) {
  constexpr bool kF64 = std::is_same_v<T, double>;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int k = L.k;
  const auto args = build_args<KMAX>(L);
  const auto dopts = opts.dtype(at::kDouble);
  int64_t width = count_slots<KMAX>(args, pass1_per_sm<T, KMAX>(false)) * proj_num_acc(KMAX);
  if constexpr (kF64) {  // the rescue launches reuse the buffer
    width = std::max(width, count_slots<KMAX>(args, pass1_per_sm<T, KMAX>(true)) * proj_num_acc(KMAX));
    width = std::max(width, count_slots<KMAX>(args, absmax_per_sm<T, KMAX>()) * (KMAX + 1));
  }
  at::Tensor partials = at::empty({std::max<int64_t>(width, 1)}, dopts);
  auto work_t = at::empty({static_cast<int64_t>((sizeof(Work) + 7) / 8)}, dopts);
  auto coeffs = at::empty({k}, dopts);
  double* pp = partials.data_ptr<double>();
  double* cp = coeffs.data_ptr<double>();
  Work* work = reinterpret_cast<Work*>(work_t.data_ptr<double>());
  const int64_t n1 = launch_pass1<T, KMAX>(args, k, nullptr, nullptr, pp, stream);
  launch_finish<KMAX>(pp, n1, k, rcond, shift, kF64 ? kSolveOrFlag : kSolve, work, cp, nullptr, stream);
  if constexpr (kF64) {  // rescue (runs only when the device flag is set)
    const int* gate = &work->rescue;
    auto absmax = [&](const ProjArgs<KMAX>& a, unsigned grid, int64_t base) {
      proj_absmax_kernel<T, KMAX><<<grid, kThreads, 0, stream>>>(a, k, gate, base, pp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    const int64_t na = for_each_launch<KMAX>(args, absmax_per_sm<T, KMAX>(), false, absmax);
    launch_finish<KMAX>(pp, na, k, rcond, shift, kScales, work, nullptr, nullptr, stream);
    const int64_t n2 = launch_pass1<T, KMAX>(args, k, work->scale, gate, pp, stream);
    launch_finish<KMAX>(pp, n2, k, rcond, shift, kRescueSolve, work, cp, nullptr, stream);
  }
  launch_pass2<T, KMAX>(args, k, work->c_apply, kF64 ? work->scale : nullptr, stream);
  return coeffs;
}

template <typename T, int KMAX>
std::tuple<at::Tensor, at::Tensor> gram_core_cuda(const HostLists& L, const double* scale,
                                                  const at::TensorOptions& opts) {
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int k = L.k;
  const auto args = build_args<KMAX>(L);
  const auto dopts = opts.dtype(at::kDouble);
  const int64_t nslots = count_slots<KMAX>(args, pass1_per_sm<T, KMAX>(scale != nullptr));
  at::Tensor partials = at::empty({std::max<int64_t>(nslots * proj_num_acc(KMAX), 1)}, dopts);
  auto G = at::empty({k, k}, dopts), b = at::empty({k}, dopts);
  double* pp = partials.data_ptr<double>();
  const int64_t n = launch_pass1<T, KMAX>(args, k, scale, nullptr, pp, stream);
  launch_finish<KMAX>(pp, n, k, 0.0, 0.0, kGram, nullptr, G.data_ptr<double>(), b.data_ptr<double>(),
                      stream);
  return {G, b};
}

// Calls fn.template operator()<scalar_t, KMAX>() for the dtype and the basis bucket of k.
template <typename Fn>
void dispatch_cuda(at::ScalarType dtype, int k, Fn&& fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "projection_cuda", [&] {
    if (k <= 2) {
      fn.template operator()<scalar_t, 2>();
    } else if (k <= 4) {
      fn.template operator()<scalar_t, 4>();
    } else {
      fn.template operator()<scalar_t, 8>();
    }
  });
}

std::tuple<at::Tensor, at::Tensor> project_orthogonal_cuda(const at::Tensor& g, const at::Tensor& basis,
                                                           std::optional<double> rcond, double ridge) {
  const ProjCall c = check_project_flat_call(g, basis, rcond, ridge, "project_orthogonal");
  c10::cuda::CUDAGuard guard(g.device());
  auto out = at::empty_like(g);
  HostLists L = make_host_lists({g}, proj_basis_rows(basis), c.k);
  L.out[0] = out.data_ptr();
  at::Tensor coeffs;
  dispatch_cuda(g.scalar_type(), L.k, [&]<typename T, int KMAX>() {
    coeffs = project_core_cuda<T, KMAX>(L, c.rcond, c.shift, g.options());
  });
  return {out, coeffs};
}

at::Tensor project_orthogonal_inplace_cuda(at::TensorList grads, at::TensorList basis,
                                           std::optional<double> rcond, double ridge) {
  const ProjCall c = check_project_lists_call(grads, basis, rcond, ridge, "project_orthogonal_");
  c10::cuda::CUDAGuard guard(grads[0].device());
  const HostLists L = make_host_lists(grads, basis, c.k);
  at::Tensor coeffs;
  dispatch_cuda(grads[0].scalar_type(), L.k, [&]<typename T, int KMAX>() {
    coeffs = project_core_cuda<T, KMAX>(L, c.rcond, c.shift, grads[0].options());
  });
  return coeffs;
}

std::tuple<at::Tensor, at::Tensor> projection_gram_cuda(at::TensorList grads, at::TensorList basis,
                                                        const std::optional<at::Tensor>& scale) {
  const int64_t k = check_projection_gram_call(grads, basis, scale, "projection_gram");
  c10::cuda::CUDAGuard guard(grads[0].device());
  const HostLists L = make_host_lists(grads, basis, k);
  const double* sp = proj_scale_ptr(scale);
  std::tuple<at::Tensor, at::Tensor> res;
  dispatch_cuda(grads[0].scalar_type(), L.k, [&]<typename T, int KMAX>() {
    res = gram_core_cuda<T, KMAX>(L, sp, grads[0].options());
  });
  return res;
}

void projection_apply_cuda(at::TensorList grads, at::TensorList basis, const at::Tensor& coeffs,
                           const std::optional<at::Tensor>& scale) {
  const int64_t k = check_projection_apply_call(grads, basis, coeffs, scale, "projection_apply_");
  c10::cuda::CUDAGuard guard(grads[0].device());
  const HostLists L = make_host_lists(grads, basis, k);
  const double* sp = proj_scale_ptr(scale);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  dispatch_cuda(grads[0].scalar_type(), L.k, [&]<typename T, int KMAX>() {
    launch_pass2<T, KMAX>(build_args<KMAX>(L), L.k, coeffs.data_ptr<double>(), sp, stream);
  });
}

at::Tensor projection_solve_cuda(const at::Tensor& gram, const at::Tensor& vg,
                                 std::optional<double> rcond, double shift) {
  const char* op = "projection_solve";
  const int64_t k = check_projection_solve(gram, vg, shift, op);
  const double rc = resolve_rcond(rcond, op);
  c10::cuda::CUDAGuard guard(gram.device());
  auto c = at::empty({k}, vg.options());
  proj_solve_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(
      gram.data_ptr<double>(), vg.data_ptr<double>(), static_cast<int>(k), rc, shift,
      c.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return c;
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CUDA, m) {
  m.impl("project_orthogonal", &project_orthogonal_cuda);
  m.impl("project_orthogonal_", &project_orthogonal_inplace_cuda);
  m.impl("projection_gram", &projection_gram_cuda);
  m.impl("projection_apply_", &projection_apply_cuda);
  m.impl("projection_solve", &projection_solve_cuda);
}

}  // namespace entangle_ext
