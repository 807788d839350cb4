// Host-side check that the tensors an in-place operator (dual_update_, project_orthogonal_,
// projection_apply_) writes share no memory with one another or with the tensors it reads. It
// runs in the backend kernels (CPU and CUDA), after their own argument checks, so that every call
// of the raw operator is checked whatever the dispatch path: grad mode, torch.no_grad() and
// torch.inference_mode() (which skips the Autograd and ADInplaceOrView kernels) alike.
//
// Metadata only (data pointer, byte size; no device synchronisation), O(n log n) in the number of
// tensors: a dense non-overlapping tensor occupies exactly [data_ptr, data_ptr + nbytes); the
// intervals sorted by start, a tensor overlaps an earlier one iff the largest end seen so far (of
// all tensors, or of the written ones for a read tensor: two read tensors may share memory)
// exceeds its start. Tensors that are empty, not dense, or without plain memory (fake, functional
// or functorch wrapper tensors) are left out. Names are built only for the message.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace entangle_ext {

// One argument: a tensor list (list = true: entries are named name[j]) or a single tensor
// (at::TensorList of one element, named name).
struct OverlapArg {
  at::TensorList ts;
  const char* name;
  bool list;
  bool written;
};

// Only CPU/CUDA dense tensors with memory of their own and concrete sizes.
inline bool overlap_plain_memory(const at::Tensor& t) {
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

// ValueError naming the first pair that shares memory: "<op>: grads[0] and grads[1] overlap in
// memory; ..." (two written tensors) or "<op>: basis[3] shares memory with grads[0], which is
// updated in place; pass a clone" (a read and a written one).
inline void check_inplace_disjoint(const char* op, std::initializer_list<OverlapArg> args) {
  struct Span {
    uintptr_t start, end;
    size_t arg, elem;
    bool written;
  };
  std::vector<Span> spans;
  size_t a = 0;
  for (const OverlapArg& arg : args) {
    for (size_t j = 0; j < arg.ts.size(); ++j) {
      const at::Tensor& t = arg.ts[j];
      if (!overlap_plain_memory(t)) continue;
      const auto start = reinterpret_cast<uintptr_t>(t.const_data_ptr());
      spans.push_back({start, start + static_cast<uintptr_t>(t.nbytes()), a, j, arg.written});
    }
    ++a;
  }
  if (spans.size() < 2) return;
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return x.start < y.start || (x.start == y.start && (x.arg < y.arg || (x.arg == y.arg && x.elem < y.elem)));
  });
  auto name = [&](const Span& s) {
    const OverlapArg& arg = *(args.begin() + s.arg);
    return arg.list ? std::string(arg.name) + "[" + std::to_string(s.elem) + "]" : std::string(arg.name);
  };
  // index of the interval with the largest end so far, among all / among the written ones
  long far_any = -1, far_w = -1;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const long j = s.written ? far_any : far_w;
    if (j >= 0 && spans[j].end > s.start) {
      const Span& x = spans[j];
      if (x.written && s.written) {
        TORCH_CHECK_VALUE(false, op, ": ", name(x), " and ", name(s),
                          " overlap in memory; every tensor updated in place needs memory of its "
                          "own (pass a clone)");
      }
      const Span& wr = x.written ? x : s;
      const Span& other = x.written ? s : x;
      TORCH_CHECK_VALUE(false, op, ": ", name(other), " shares memory with ", name(wr),
                        ", which is updated in place; pass a clone");
    }
    if (far_any < 0 || s.end > spans[far_any].end) far_any = static_cast<long>(i);
    if (s.written && (far_w < 0 || s.end > spans[far_w].end)) far_w = static_cast<long>(i);
  }
}

}  // namespace entangle_ext
