// The one place that defines every entangle_ext operator schema (TORCH_LIBRARY), plus the small
// pybind11 module that reports how the extension was built (Python builds only; the CMake build
// for C++ users produces a plain shared library that registers the same
// operators). Backend kernels register themselves with TORCH_LIBRARY_IMPL in csrc/cpu/*.cpp and csrc/cuda/*.cu.
#include <torch/library.h>
#ifdef TORCH_EXTENSION_NAME  // Python build (setup.py): add the pybind11 build-info module
#include <torch/extension.h>
#endif
#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/autograd/variable.h>

#include "projection.h"
#include "wasserstein_autograd.h"

#ifndef ENTANGLE_VERSION
#define ENTANGLE_VERSION "0.0.0+unknown"
#endif
#ifndef ENTANGLE_TORCH_VERSION
#define ENTANGLE_TORCH_VERSION "unknown"
#endif
#ifndef ENTANGLE_CUDA_ARCH_LIST
#define ENTANGLE_CUDA_ARCH_LIST ""
#endif

TORCH_LIBRARY(entangle_ext, m) {
  // ---- Wasserstein-2 between 1-D empirical distributions, by segmented stable sort ----------
  // u: (Nu,) float32/float64 flat values; u_offsets: (S+1,) int64 prefix sums (cu_seqlens).
  // Same for v. max_seqlen: an upper bound on every segment length of u and v, or -1 if unknown
  // (lets the CUDA kernel pick its shared-memory path without reading the offsets on the host).
  // grad_u / grad_v: also return dW2^2_s/du (resp. dv) at every input position, where s is the
  // position's segment ((0,) otherwise); the backward then only scales them by grad[s].
  // validate: raise ValueError on non-finite values, malformed or empty segments and a max_seqlen
  // below the longest segment (on CUDA: one host sync).
  // Returns (w2sq (S,), du (Nu,) or (0,), dv (Nv,) or (0,)). Shared code: csrc/wasserstein.h.
  m.def(
      "wasserstein2_1d(Tensor u, Tensor v, Tensor u_offsets, Tensor v_offsets, int max_seqlen, "
      "bool grad_u=False, bool grad_v=False, bool validate=False) -> (Tensor, Tensor, Tensor)");
  // Gradient of sum_s grad[s] * W2^2_s: (grad[s(p)] * du[p], grad[s(p)] * dv[p]); an empty du/dv
  // gives an empty result.
  m.def(
      "wasserstein2_1d_backward(Tensor grad, Tensor du, Tensor dv, Tensor u_offsets, "
      "Tensor v_offsets) -> (Tensor, Tensor)");

  // ---- Augmented Lagrangian: dual update and penalty term (docs/algorithm.md §2, §6) ----------
  // lam: (m,) float32/float64 multipliers (m >= 0); g: (m,) constraint values, same dtype/device;
  // mu: () or (m,) penalty (a tensor so that a schedule is not frozen into a captured CUDA graph).
  // kind: "equality" | "inequality" (g <= 0 convention). Shared helpers:
  // csrc/augmented_lagrangian.h; kernels: csrc/{cpu,cuda}/augmented_lagrangian.*
  // In place: lam <- clip_[lam_min, lam_max](proj((1 - damping) * lam + mu * g)), proj = max(0, .)
  // for inequality. Entries with non-finite g or mu keep lam. check_finite: raise ValueError (and
  // leave lam untouched) on non-finite g/mu; on CUDA this costs one host sync (not capturable).
  m.def(
      "dual_update_(Tensor(a!) lam, Tensor g, Tensor mu, str kind, float? lam_min, "
      "float? lam_max, float damping, bool check_finite) -> ()");
  // sum_i term_i -> (): equality lam_i g_i + mu_i/2 g_i^2; inequality
  // (1/(2 mu_i)) (max(0, lam_i + mu_i g_i)^2 - lam_i^2).
  m.def("augmented_lagrangian(Tensor g, Tensor lam, Tensor mu, str kind) -> Tensor");
  // grad * d/dg: equality lam + mu g; inequality max(0, lam + mu g). grad: () -> (m,).
  m.def(
      "augmented_lagrangian_backward(Tensor grad, Tensor g, Tensor lam, Tensor mu, str kind) "
      "-> Tensor");
  // ---- end augmented Lagrangian ----------------------------------------------------------------

  // ---- Low-rank orthogonal gradient projection (docs/algorithm.md §5, Prop. 4.1) ---------------
  // out = g - V^T c, c = (V V^T + shift I)^+ V g: float64 solve with a relative eigenvalue cutoff
  // rcond (None: kProjDefaultRcond) on the row-normalised Gram. Shared code: csrc/projection.h;
  // kernels: csrc/cpu/projection*.cpp, csrc/cuda/projection.cu.
  // Flat: g (P,), basis (k, P) contiguous, same dtype (f32/f64/f16/bf16) and device, 1 <= k <= 8;
  // ridge >= 0 is added to the Gram diagonal. Returns (out (P,) dtype of g, coeffs (k,) float64).
  m.def(
      "project_orthogonal(Tensor g, Tensor basis, float? rcond=None, float ridge=0.0) "
      "-> (Tensor, Tensor)");
  // In place over a tensor list (no flattening): grads = T dense non-overlapping tensors, modified
  // in place; basis = k*T tensors, row-major by basis vector (basis[i*T + t] matches grads[t] in
  // shape, memory layout, dtype, device); ridge * T is added to the Gram diagonal.
  // Returns coeffs (k,) float64 on the device of grads.
  m.def(
      "project_orthogonal_(Tensor(a!)[] grads, Tensor[] basis, float? rcond=None, "
      "float ridge=0.0) -> Tensor");
  // The two passes, for gradients sharded across processes (sum the partials, then solve, apply).
  // Pass 1: (G (k, k), b (k,)) float64 partial sums G = V V^T, b = V g over the given tensors;
  // scale (k+1,) float64 multiplies the basis rows and g (last entry) first (powers of two).
  m.def(
      "projection_gram(Tensor[] grads, Tensor[] basis, Tensor? scale=None) -> (Tensor, Tensor)");
  // Pass 2, in place: grads -= sum_i coeffs[i] * scale[i] * basis[i] (coeffs, scale: (k,) float64).
  m.def(
      "projection_apply_(Tensor(a!)[] grads, Tensor[] basis, Tensor coeffs, Tensor? scale=None) "
      "-> ()");
  // The solve: c (k,) float64 from gram (k, k) and vg (k,) float64 (lower triangle of gram read),
  // shift >= 0 added to the diagonal. The same code as the fused ops.
  m.def("projection_solve(Tensor gram, Tensor vg, float? rcond=None, float shift=0.0) -> Tensor");
}

// Autograd of wasserstein2_1d in C++ (csrc/wasserstein_autograd.h): a few microseconds per call
// instead of the ~40 of a Python registration; the fake kernels are registered in Python.
TORCH_LIBRARY_IMPL(entangle_ext, Autograd, m) {
  m.impl("wasserstein2_1d", &entangle_ext::w2::w2_autograd);
  m.impl("wasserstein2_1d_backward", &entangle_ext::w2::w2_backward_autograd);
}

// ADInplaceOrView kernel of the in-place operators (dual_update_, project_orthogonal_,
// projection_apply_): run the operator below this key, then bump the version counter of every
// argument its schema marks as written (Tensor(a!) and Tensor(a!)[]), as ATen's own in-place ops
// do. Without it autograd cannot see the write: a backward through a tensor saved before it (a λ
// saved by the penalty term, then updated by the dual step) would silently use the new values.
namespace {
void bump_written_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t start = stack->size() - args.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    const c10::IValue& value = (*stack)[start + i];
    if (value.isTensor()) {
      written.push_back(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) written.push_back(t);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) {
    if (t.defined()) torch::autograd::impl::bump_version(t);
  }
}
}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, ADInplaceOrView, m) {
  for (const char* name : {"dual_update_", "project_orthogonal_", "projection_apply_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&bump_written_versions>());
  }
}

// Autograd kernel of the same in-place operators. They have no derivative, so (as ATen's in-place
// ops refuse a leaf that requires grad) a written tensor that requires grad while grad mode is on
// is refused (RuntimeError), whether it is a leaf, a view of one or a non-leaf (its gradient
// through the write would silently be wrong); then redispatch below autograd (ADInplaceOrView
// bumps the versions). The memory-overlap check is the backend kernels' (csrc/overlap.h), so it
// also holds under torch.inference_mode(), which skips this kernel. Names only on error.
namespace {
void refuse_written_requiring_grad(const c10::OperatorHandle& op, const c10::Argument& arg,
                                   const at::Tensor& t, const std::string& index) {
  const char* what = t.is_leaf() ? "a leaf Variable that requires grad"
                     : (t.is_view() && t._base().is_leaf()) ? "a view of a leaf Variable that requires grad"
                                                             : "a tensor that requires grad";
  TORCH_CHECK(false, op.schema().name(), ": ", arg.name(), index, " is ", what,
              " and is being used in an in-place operation that has no autograd (its gradient "
              "would be wrong); pass a tensor that does not require grad (e.g. p.grad or "
              "x.detach()) or call it under torch.no_grad()");
}

void inplace_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled()) {
    const auto& args = op.schema().arguments();
    const size_t start = stack->size() - args.size();
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::AliasInfo* alias = args[i].alias_info();
      if (alias == nullptr || !alias->isWrite()) continue;
      const c10::IValue& value = (*stack)[start + i];
      if (value.isTensor()) {
        const at::Tensor& t = value.toTensor();
        if (t.defined() && t.requires_grad()) refuse_written_requiring_grad(op, args[i], t, "");
      } else if (value.isTensorList()) {
        const auto ts = value.toTensorList();
        for (size_t j = 0; j < ts.size(); ++j) {
          const at::Tensor t = ts.get(j);
          if (t.defined() && t.requires_grad()) {
            refuse_written_requiring_grad(op, args[i], t, "[" + std::to_string(j) + "]");
          }
        }
      }
    }
  }
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}
}  // namespace

TORCH_LIBRARY_IMPL(entangle_ext, Autograd, m) {
  for (const char* name : {"dual_update_", "project_orthogonal_", "projection_apply_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&inplace_autograd>());
  }
}

#ifdef TORCH_EXTENSION_NAME

namespace entangle_ext {
const char* projection_cpu_kernel_name();  // csrc/cpu/projection.cpp
}  // namespace entangle_ext

namespace {
bool cuda_built() {
#ifdef ENTANGLE_WITH_CUDA
  return true;
#else
  return false;
#endif
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "entangle_ext native extension: build information (operators live in torch.ops.entangle_ext)";
  m.def("cuda_built", &cuda_built, "True when the CUDA kernels were compiled into this build.");
  m.def("cuda_arch_list", []() { return std::string(ENTANGLE_CUDA_ARCH_LIST); },
        "TORCH_CUDA_ARCH_LIST the CUDA kernels were compiled for ('' for a CPU-only build).");
  m.def("version", []() { return std::string(ENTANGLE_VERSION); }, "entangle_ext version.");
  m.def("torch_version", []() { return std::string(ENTANGLE_TORCH_VERSION); },
        "The torch version this binary was compiled against.");
  m.def("projection_max_basis", []() { return entangle_ext::kProjMaxK; },
        "Largest number of basis vectors k of the projection operators.");
  m.def("projection_default_rcond", []() { return entangle_ext::kProjDefaultRcond; },
        "Default relative eigenvalue cutoff of the projection operators.");
  m.def("projection_cpu_kernel", []() { return std::string(entangle_ext::projection_cpu_kernel_name()); },
        "The CPU kernel variant of the projection operators in use: avx512, avx2 or default.");
}
#endif  // TORCH_EXTENSION_NAME
