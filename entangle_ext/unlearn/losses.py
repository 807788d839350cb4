"""Per-sample losses and gradient estimates the stages are built from: per-sample cross-entropy,
the Stage-2 forget objective L̃_f with its Wasserstein-2 term (docs/algorithm.md §3, §4), and
gradients accumulated over several minibatches in bounded-memory forward passes.

Under several ranks (docs/algorithm.md §11) the batches given here are this rank's parts of the
global batches; means and the Wasserstein-2 term are taken over the global batches (`Dist.means`,
`Dist.gather`) and every gradient returned is the global one, averaged over the ranks once.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .._ext import available
from ..reference.wasserstein import wasserstein2_1d as _w2_reference
from ..wasserstein import wasserstein2_1d
from .config import MicroBatch, Stage2Config
from .data import batch_size_of, loss_logits, slice_batch, sliceable, split_batch
from .distributed import current
from .nest import tensors

__all__ = ["trainable_params", "loss_logits", "per_sample_ce", "mean_ce", "grads_of", "forget_objective",
           "forget_grad", "remote_grad", "auto_micro_batch", "CPU_CHUNK_BYTES"]

Grads = List[torch.Tensor]

#: Bytes that micro_batch="auto" allows the largest activation of one forward pass on CPU: half
#: the 32 MiB L3 cache of the machine it was measured on (see `Stage2Config`: per-sample cost is
#: flat while that activation stays within about 24 MiB and rises 20-45 % beyond the L3 size).
CPU_CHUNK_BYTES = 16 * 2 ** 20


def trainable_params(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    """The parameters with ``requires_grad``, in ``model.parameters()`` order."""
    return [p for p in model.parameters() if p.requires_grad]


def per_sample_ce(model: torch.nn.Module, batch) -> torch.Tensor:
    """Per-sample cross-entropy ℓ_i (nats), shape (B,), on the logits' device, in the logits'
    dtype (float32 for float16/bfloat16 logits, e.g. under autocast: `loss_logits`)."""
    inputs, y = split_batch(batch)
    return F.cross_entropy(loss_logits(model, inputs), y, reduction="none")


def mean_ce(model: torch.nn.Module, batch) -> torch.Tensor:
    """Mean cross-entropy (nats, 0-d) over the global batch whose part on this rank is ``batch``
    (`Dist.means`; ``per_sample_ce(model, batch).mean()`` for one process)."""
    return current().means(per_sample_ce(model, batch))[0]


def grads_of(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> Grads:
    """∇ loss for each parameter (zeros for parameters the loss does not reach), averaged over the
    ranks of a distributed run (docs/algorithm.md §11); no ``.grad`` is left behind."""
    acc = current().grads(params)
    acc.add(loss)
    return acc.result()


def auto_micro_batch(model: torch.nn.Module, batch) -> Optional[int]:
    """The micro-batch that ``micro_batch="auto"`` stands for (`Stage2Config`, docs/algorithm.md
    §3): on CPU in one process, the number of samples (>= 1) whose largest activation fits in
    `CPU_CHUNK_BYTES`; None (one pass) on any other device and under several ranks (where every
    rank must take the same passes).

    The largest activation per sample is the largest output of any submodule in one no-grad
    forward pass of the first sample of ``batch`` (a tuple/list or dict batch on the model's
    device, as the stages make them), run in eval mode; every module's mode is restored after it.
    A model whose submodules output no tensor gives None.
    """
    _, y = split_batch(batch)
    if current().active or y.device.type != "cpu" or not sliceable(batch):
        return None
    largest = 0

    def hook(_module, _inputs, out):
        nonlocal largest
        largest = max([largest] + [t.nbytes for t in tensors(out)])

    modes = [(m, m.training) for m in model.modules()]
    handles = [m.register_forward_hook(hook) for m, _ in modes]
    try:
        model.eval()
        with torch.no_grad():
            per_sample_ce(model, slice_batch(batch, 0, 1))
    finally:
        for h in handles:
            h.remove()
        for m, training in modes:
            m.training = training
    return max(1, CPU_CHUNK_BYTES // largest) if largest else None


def _resolve(model, batches: List[Any], micro_batch: MicroBatch) -> Optional[int]:
    """``micro_batch`` with "auto" replaced by `auto_micro_batch` of the first batch."""
    return auto_micro_batch(model, batches[0]) if micro_batch == "auto" else micro_batch


def _chunks(batches: List[Any], micro_batch: Optional[int], sizes: List[int]):
    """Group this rank's parts of the global batches of ``sizes`` into forward passes: one
    concatenated pass (micro_batch None), slices of at most micro_batch samples, or one pass per
    batch when shapes cannot be concatenated. Every rank takes the same number of passes (slices
    are counted on the longest rank's part; trailing ones may be empty)."""
    d = current()
    cat = d.concat(batches)
    if cat is None or not sliceable(cat):   # inputs that are not cut into samples: one pass per batch
        return batches
    n, longest = batch_size_of(cat), d.longest(sizes)
    if micro_batch is None or micro_batch >= longest:
        return [cat]
    return [slice_batch(cat, i, min(i + micro_batch, n)) for i in range(0, longest, micro_batch)]


def _w2(a: torch.Tensor, b: torch.Tensor, sizes: List[int], per_batch: bool) -> torch.Tensor:
    """Σ over segments of W2²(a_seg, b_seg) in ONE operator call (dense (S, n) or ragged)."""
    if available():
        fn, kw = wasserstein2_1d, {"validate": False}
    else:
        warnings.warn("entangle_ext native extension not loaded; using the pure-PyTorch W2 reference",
                      RuntimeWarning, stacklevel=3)
        fn, kw = _w2_reference, {}
    if not per_batch or len(sizes) == 1:
        return fn(a, b, reduction="sum", **kw)
    if all(s == sizes[0] for s in sizes):
        S, n = len(sizes), sizes[0]
        return fn(a.view(S, n), b.view(S, n), reduction="sum", **kw)
    off = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0).tolist()), dtype=torch.long)
    off = off.to(a.device, non_blocking=True)   # host-known sizes: async copy, no stream sync
    if fn is _w2_reference:
        return fn(a, b, off, off, reduction="sum")
    return fn(a, b, off, off, reduction="sum", max_seqlen=max(sizes), **kw)


def forget_objective(a: torch.Tensor, b: torch.Tensor, sizes: List[int], config: Stage2Config):
    """L̃_f of Stage 2 (docs/algorithm.md §3) given a = −ℓ(θ) and b = −ℓ(θ̄), both (N,) over the
    concatenated forget batches of ``sizes``: Σ_batches[(1−α)·mean(sign·ℓ) + α·W2²(a, b)]
    (reference, w2_scope="minibatch") or (1−α)·mean(sign·ℓ) + α·W2² over all N samples
    (w2_scope="forget_set"). Returns (objective, Σ W2², mean forget CE), 0-d tensors."""
    per_batch = config.w2_scope == "minibatch"
    ell = -a
    sign = float(config.forget_mean_sign)
    if per_batch:
        if all(s == sizes[0] for s in sizes):
            mean_term = ell.view(len(sizes), sizes[0]).mean(1).sum()
        else:
            w = torch.cat([torch.full((s,), 1.0 / s, dtype=ell.dtype) for s in sizes])
            mean_term = (w.to(ell.device, non_blocking=True) * ell).sum()
    else:
        mean_term = ell.mean()
    w2 = _w2(a, b, sizes, per_batch)
    obj = (1.0 - config.alpha) * sign * mean_term + config.alpha * w2
    return obj, w2, ell.detach().mean()


def forget_grad(model, params, batches: List[Any], b_ref: torch.Tensor, sizes: List[int],
                config: Stage2Config):
    """g_f = ∇ L̃_f over the forget ``batches`` (this rank's parts of global batches of ``sizes``),
    with the reference values b = −ℓ(θ̄) of all their samples ``b_ref`` ((Σ sizes,), global order).
    The per-sample losses of every rank are gathered (`Dist.gather`) so that W2² and the mean term
    see the whole global batches. With several forward chunks (``config.micro_batch``, "auto"
    resolved by `auto_micro_batch`): d obj / d ℓ from a no-grad pass, then Σ_chunks ∇(w·ℓ) (exact,
    bounded memory).
    Returns (g_f, objective, W2², mean forget CE), the last three 0-d detached tensors."""
    d = current()
    chunks = _chunks(batches, _resolve(model, batches, config.micro_batch), sizes)
    acc = d.grads(params)
    if len(chunks) == 1:
        a = d.gather(-per_sample_ce(model, chunks[0]), sizes)
        obj, w2, mce = forget_objective(a, b_ref.to(a.dtype), sizes, config)
        acc.add(obj)
        return acc.result(), obj.detach(), w2.detach(), mce
    with torch.no_grad():
        a0 = d.gather(torch.cat([-per_sample_ce(model, c) for c in chunks]), sizes)
    a0.requires_grad_(True)
    with torch.enable_grad():
        obj, w2, mce = forget_objective(a0, b_ref.to(a0.dtype), sizes, config)
        (w,) = torch.autograd.grad(obj, a0)
    w = d.local_part(w, sizes) * d.world   # a rank's share, scaled like the gathered objective's
    off = 0
    for j, c in enumerate(chunks):
        n = batch_size_of(c)
        acc.add((w[off:off + n] * -per_sample_ce(model, c)).sum(), last=j == len(chunks) - 1)
        off += n
    return acc.result(), obj.detach(), w2.detach(), mce


def remote_grad(model, params, batches: List[Any], sizes: List[int],
                micro_batch: MicroBatch) -> Tuple[Grads, torch.Tensor]:
    """g_rem = ∇ Σ_b mean CE(batch b) over the remote ``batches`` (this rank's parts of global
    batches of ``sizes``), in chunks of at most ``micro_batch`` samples (None: one pass; "auto":
    `auto_micro_batch`). Returns (g_rem, mean over batches of the batch-mean CE, 0-d). The
    per-sample weights 1/|R_k| are built in the losses' dtype (exact in float64)."""
    d = current()
    local = [batch_size_of(b) for b in batches]
    chunks = _chunks(batches, _resolve(model, batches, micro_batch), sizes)
    acc, off, total, wts = d.grads(params), 0, None, None
    for j, c in enumerate(chunks):
        ce = per_sample_ce(model, c)
        if wts is None:
            wts = torch.cat([torch.full((m,), 1.0 / s, dtype=ce.dtype, device=ce.device)
                             for m, s in zip(local, sizes)])
        n = ce.shape[0]
        loss = (wts[off:off + n] * ce).sum()     # this rank's share of the objective
        acc.add(loss * d.world if d.active else loss, last=j == len(chunks) - 1)
        total = loss.detach() if total is None else total + loss.detach()
        off += n
    return acc.result(), d.sum_(total) / len(sizes)
