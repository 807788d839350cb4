// CUDA kernels of the augmented-Lagrangian operators (Stage 1, docs/algorithm.md §2 and §6).
//
// Everything runs on the current stream; no host synchronisation, except dual_update_ with
// check_finite=true, which reads one flag back to raise a ValueError before lam is touched (and
// refuses to run during CUDA-graph capture). With check_finite=false the kernel itself leaves lam
// unchanged wherever g or mu is non-finite (device-side select), so the captured path is safe.
//   dual_update_                  one thread per multiplier (elementwise, in place)
//   augmented_lagrangian          one block, fixed-order cub::BlockReduce (deterministic)
//   augmented_lagrangian_backward one thread per entry
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/cub.cuh>

#include <algorithm>
#include <optional>

#include "../common.h"
#include "../augmented_lagrangian.h"

namespace entangle_ext {
namespace {

constexpr int kBlock = 256;

inline unsigned grid_for_m(int64_t m) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((m + kBlock - 1) / kBlock, 4096)));
}

template <typename T>
__global__ void dual_update_kernel(T* __restrict__ lam, const T* __restrict__ g,
                                   const T* __restrict__ mu, int64_t mu_stride, int64_t m, int kind,
                                   double keep, bool has_lo, double lo, bool has_hi, double hi) {
  using acc_t = at::acc_type<T, /*is_cuda=*/false>;  // double for float32, as on CPU
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m;
       i += (int64_t)gridDim.x * blockDim.x) {
    lam[i] = static_cast<T>(dual_step<acc_t>(acc_t(lam[i]), acc_t(g[i]), acc_t(mu[i * mu_stride]),
                                             kind, acc_t(keep), has_lo, acc_t(lo), has_hi,
                                             acc_t(hi)));
  }
}

template <typename T>
__global__ void al_forward_kernel(const T* __restrict__ g, const T* __restrict__ lam,
                                  const T* __restrict__ mu, int64_t mu_stride, int64_t m, int kind,
                                  T* __restrict__ out) {
  using acc_t = at::acc_type<T, /*is_cuda=*/false>;  // double for float32, as on CPU
  using Reduce = cub::BlockReduce<acc_t, kBlock>;
  __shared__ typename Reduce::TempStorage tmp;
  acc_t part = 0;
  for (int64_t i = threadIdx.x; i < m; i += kBlock)
    part += al_term<acc_t>(acc_t(g[i]), acc_t(lam[i]), acc_t(mu[i * mu_stride]), kind);
  const acc_t total = Reduce(tmp).Sum(part);
  if (threadIdx.x == 0) *out = static_cast<T>(total);
}

template <typename T>
__global__ void al_backward_kernel(const T* __restrict__ grad, const T* __restrict__ g,
                                   const T* __restrict__ lam, const T* __restrict__ mu,
                                   int64_t mu_stride, int64_t m, int kind, T* __restrict__ out) {
  using acc_t = at::acc_type<T, /*is_cuda=*/false>;  // double for float32, as on CPU
  const acc_t w = acc_t(*grad);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = static_cast<T>(w * al_grad<acc_t>(acc_t(g[i]), acc_t(lam[i]), acc_t(mu[i * mu_stride]), kind));
}

void dual_update_cuda(const at::Tensor& lam, const at::Tensor& g, const at::Tensor& mu,
                      c10::string_view kind_s, std::optional<double> lam_min,
                      std::optional<double> lam_max, double damping, bool check_finite) {
  const char* op = "dual_update_";
  const int64_t mu_stride = check_dual_update_tensors(lam, g, mu, op);
  const ConstraintKind kind = parse_kind(kind_s, op);
  check_dual_update_args(kind, lam_min, lam_max, damping, op);
  c10::cuda::CUDAGuard guard(lam.device());
  const int64_t m = lam.size(0);
  if (m == 0) return;
  if (check_finite) {
    TORCH_CHECK(at::cuda::currentStreamCaptureStatus() == at::cuda::CaptureStatus::None, op,
                ": check_finite=True reads a flag back to the host, which is not allowed during "
                "CUDA-graph capture; pass check_finite=False (non-finite entries then leave lam "
                "unchanged on the device)");
    // One host sync: decide before lam is written, so that an error leaves it unchanged.
    const bool ok = at::logical_and(at::isfinite(g).all(), at::isfinite(mu).all()).item<bool>();
    TORCH_CHECK_VALUE(ok, op, ": g or mu contains non-finite values (NaN/Inf); lam was left "
                      "unchanged");
  }
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(lam.scalar_type(), "dual_update_cuda", [&] {
    dual_update_kernel<scalar_t><<<grid_for_m(m), kBlock, 0, stream>>>(
        lam.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), mu.data_ptr<scalar_t>(), mu_stride, m,
        static_cast<int>(kind), 1.0 - damping, lam_min.has_value(), lam_min.value_or(0.0),
        lam_max.has_value(), lam_max.value_or(0.0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor al_forward_cuda(const at::Tensor& g, const at::Tensor& lam, const at::Tensor& mu,
                           c10::string_view kind_s) {
  const char* op = "augmented_lagrangian";
  const int64_t mu_stride = check_al_inputs(lam, g, mu, op);
  const int kind = static_cast<int>(parse_kind(kind_s, op));
  c10::cuda::CUDAGuard guard(g.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto out = at::empty({}, g.options());
  const int64_t m = lam.size(0);
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "augmented_lagrangian_cuda", [&] {
    al_forward_kernel<scalar_t><<<1, kBlock, 0, stream>>>(
        g.data_ptr<scalar_t>(), lam.data_ptr<scalar_t>(), mu.data_ptr<scalar_t>(), mu_stride, m,
        kind, out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor al_backward_cuda(const at::Tensor& grad, const at::Tensor& g, const at::Tensor& lam,
                            const at::Tensor& mu, c10::string_view kind_s) {
  const char* op = "augmented_lagrangian_backward";
  const int64_t mu_stride = check_al_backward_inputs(grad, g, lam, mu, op);
  const int kind = static_cast<int>(parse_kind(kind_s, op));
  c10::cuda::CUDAGuard guard(g.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto out = at::empty_like(g);
  const int64_t m = lam.size(0);
  if (m == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "augmented_lagrangian_backward_cuda", [&] {
    al_backward_kernel<scalar_t><<<grid_for_m(m), kBlock, 0, stream>>>(
        grad.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), lam.data_ptr<scalar_t>(),
        mu.data_ptr<scalar_t>(), mu_stride, m, kind, out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, CUDA, m) {
  m.impl("dual_update_", &dual_update_cuda);
  m.impl("augmented_lagrangian", &al_forward_cuda);
  m.impl("augmented_lagrangian_backward", &al_backward_cuda);
}

}  // namespace entangle_ext
