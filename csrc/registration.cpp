// The one place that defines every entangle_ext operator schema (TORCH_LIBRARY), plus the small
// pybind11 module that reports how the extension was built (Python builds only; the CMake build
// for C++ users produces a plain shared library that registers the same
// operators). Backend kernels register themselves with TORCH_LIBRARY_IMPL in csrc/cpu/*.cpp and csrc/cuda/*.cu.
#include <torch/library.h>
#ifdef TORCH_EXTENSION_NAME  // Python build (setup.py): add the pybind11 build-info module
#include <torch/extension.h>
#endif
#include <algorithm>
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
// through the write would silently be wrong). Then, for tensors with real memory (CPU/CUDA, not
// fake, functional or other wrapper tensors), a written tensor that shares memory with another
// argument is refused (ValueError), as the Python wrappers do: sorted intervals
// [data_ptr, data_ptr + nbytes) of the dense non-overlapping tensors, O(n log n), metadata only
// (no device sync). Then redispatch below autograd (ADInplaceOrView bumps the versions).
namespace {
struct ArgRef {
  at::Tensor t;
  std::string name;
  bool written;
};

// Only CPU/CUDA dense tensors with memory of their own and concrete sizes: fake tensors (Python
// key; symbolic sizes under torch.compile), functional and functorch wrappers are left out.
bool plain_memory(const at::Tensor& t) {
  if (!t.defined()) return false;
  const c10::DispatchKeySet ks = t.key_set();
  if (ks.has(c10::DispatchKey::Python) || ks.has(c10::DispatchKey::PythonTLSSnapshot) ||
      ks.has(c10::DispatchKey::Functionalize) || ks.has(c10::DispatchKey::FuncTorchBatched) ||
      ks.has(c10::DispatchKey::FuncTorchGradWrapper) ||
      ks.has(c10::DispatchKey::BatchedNestedTensor)) {
    return false;
  }
  const auto dev = t.device().type();
  if (dev != c10::DeviceType::CPU && dev != c10::DeviceType::CUDA) return false;
  if (t.layout() != c10::kStrided || t.is_nested() || !t.has_storage()) return false;
  if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
  return t.numel() > 0 && t.is_non_overlapping_and_dense();
}

// The list operators (project_orthogonal_, projection_apply_): leave a malformed call (no
// gradient, a basis list that is not k * T tensors with 1 <= k <= kProjMaxK) to the kernels' own
// messages, which name the real problem.
bool lists_well_formed(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t start) {
  const auto& args = schema.arguments();
  int64_t T = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[start + i];
    if (!v.isTensorList()) continue;
    const int64_t n = static_cast<int64_t>(v.toTensorVector().size());
    if (T < 0) {   // the first list: the gradients
      if (n == 0) return false;
      T = n;
    } else if (n % T != 0 || n / T < 1 || n / T > entangle_ext::kProjMaxK) {
      return false;
    }
  }
  return true;
}

void check_no_overlap(const std::string& op, const std::vector<ArgRef>& args) {
  struct Span {
    uintptr_t start, end;
    size_t idx;
  };
  std::vector<Span> spans;
  c10::optional<c10::Device> dev;
  for (size_t i = 0; i < args.size(); ++i) {
    const at::Tensor& t = args[i].t;
    if (!plain_memory(t)) continue;
    if (!dev.has_value()) dev = t.device();
    if (t.device() != *dev) return;   // a device mismatch: the kernels refuse it with their message
    const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
    spans.push_back({start, start + static_cast<uintptr_t>(t.nbytes()), i});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.start < b.start || (a.start == b.start && a.idx < b.idx); });
  // largest end so far among all intervals / among the written ones
  long far_any = -1, far_w = -1;
  uintptr_t end_any = 0, end_w = 0;
  for (const Span& s : spans) {
    const bool w = args[s.idx].written;
    const long j = w ? far_any : far_w;
    const uintptr_t end = w ? end_any : end_w;
    if (j >= 0 && end > s.start) {
      const ArgRef& a = args[spans[j].idx];
      const ArgRef& b = args[s.idx];
      const ArgRef& wr = a.written ? a : b;
      const ArgRef& other = a.written ? b : a;
      if (other.written) {
        TORCH_CHECK_VALUE(false, op, ": ", a.name, " and ", b.name,
                          " overlap in memory; every tensor updated in place needs memory of its "
                          "own (pass a clone)");
      }
      TORCH_CHECK_VALUE(false, op, ": ", other.name, " shares memory with ", wr.name,
                        ", which is updated in place; pass a clone");
    }
    const long pos = static_cast<long>(&s - spans.data());
    if (far_any < 0 || s.end > end_any) { far_any = pos; end_any = s.end; }
    if (w && (far_w < 0 || s.end > end_w)) { far_w = pos; end_w = s.end; }
  }
}

void inplace_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::string name = "entangle_ext::" + schema.name().substr(schema.name().find("::") + 2);
  const auto& args = schema.arguments();
  const size_t start = stack->size() - args.size();
  std::vector<ArgRef> refs;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    const bool written = alias != nullptr && alias->isWrite();
    const c10::IValue& value = (*stack)[start + i];
    if (value.isTensor()) {
      refs.push_back({value.toTensor(), args[i].name(), written});
    } else if (value.isTensorList()) {
      const auto ts = value.toTensorVector();
      for (size_t j = 0; j < ts.size(); ++j) {
        refs.push_back({ts[j], args[i].name() + "[" + std::to_string(j) + "]", written});
      }
    }
  }
  if (at::GradMode::is_enabled()) {
    for (const ArgRef& r : refs) {
      if (!r.written || !r.t.defined() || !r.t.requires_grad()) continue;
      const char* what = r.t.is_leaf() ? "a leaf Variable that requires grad"
                         : (r.t.is_view() && r.t._base().is_leaf())
                             ? "a view of a leaf Variable that requires grad"
                             : "a tensor that requires grad";
      TORCH_CHECK(false, name, ": ", r.name, " is ", what,
                  " and is being used in an in-place operation that has no autograd (its gradient "
                  "would be wrong); pass a tensor that does not require grad (e.g. p.grad or "
                  "x.detach()) or call it under torch.no_grad()");
    }
  }
  if (lists_well_formed(schema, *stack, start)) check_no_overlap(name, refs);
  refs.clear();
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
#include "projection.h"

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
