"""Stage 1 (augmented Lagrangian) and Stage 2 (W-PGD) of method.md.

Both stages keep the model in eval mode (BatchNorm statistics frozen, dropout off) and never read
device values back to the host inside a step: logged scalars are kept on the device and read every
``log_every`` steps, which is also when non-finite losses are detected.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import entangle_ext as _ee
from ..dual import augmented_lagrangian_term, dual_update_
from ..projection import project_orthogonal_
from .config import Stage1Config, Stage2Config
from .data import (BatchStream, Splits, batch_size_of, concat_batches, forward_logits, slice_batch,
                   split_batch)

__all__ = ["stage1", "stage2", "remote_loss_c0", "NonFiniteLossError", "StageResult",
           "trainable_params", "per_sample_ce"]


class NonFiniteLossError(ValueError):
    """A stage produced a NaN/Inf loss. Attributes: stage (1/2), step (first bad step, 0-based
    within the stage), checkpoint (path of the last good checkpoint or None)."""

    def __init__(self, stage: int, step: int, checkpoint: Optional[str]):
        self.stage, self.step, self.checkpoint = stage, step, checkpoint
        where = f"; last good checkpoint: {checkpoint}" if checkpoint else \
            " (no checkpoint was written: pass out_dir / checkpoint_every to keep one)"
        super().__init__(f"non-finite loss in Stage {stage} at step {step}; stopped{where}")


@dataclass
class StageResult:
    """Outcome of one stage: ``steps`` taken in total, the per-step ``history`` (list of dicts of
    floats), and stage state (Stage 1: ``lam`` (λ, 0-d device tensor), ``c0`` (float, nats);
    Stage 2: ``momentum`` (list of tensors shaped like the trainable parameters))."""
    stage: int
    steps: int
    history: List[Dict[str, float]] = field(default_factory=list)
    lam: Optional[torch.Tensor] = None
    c0: Optional[float] = None
    momentum: Optional[List[torch.Tensor]] = None


def trainable_params(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def per_sample_ce(model: torch.nn.Module, batch) -> torch.Tensor:
    """Per-sample cross-entropy ℓ_i (nats), shape (B,), dtype of the logits, on their device."""
    inputs, y = split_batch(batch)
    return F.cross_entropy(forward_logits(model, inputs), y, reduction="none")


@torch.no_grad()
def remote_loss_c0(model: torch.nn.Module, dataset, device, batch_size: int = 512) -> float:
    """c0 = mean CE (nats) of ``model`` over the whole dataset (method.md Stage 1), no grad.

    One host read at the end. Raises ValueError for an empty dataset or non 2-D logits.
    """
    if len(dataset) == 0:
        raise ValueError("remote split is empty")
    model.eval()
    s = BatchStream(dataset, batch_size, shuffle=False, seed=0, name="c0", device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for b in s.epoch_batches(0):
        total += per_sample_ce(model, b).double().sum()
    return float(total) / len(dataset)


class _Monitor:
    """Per-step device-side scalars; host reads only at flush (every log_every steps)."""

    def __init__(self, stage: int, keys: List[str], device, start_step: int):
        self.stage, self.keys = stage, keys
        self.pending: List[torch.Tensor] = []
        self.pending_steps: List[int] = []
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.step_t = torch.full((), start_step, dtype=torch.long, device=device)
        self.history: List[Dict[str, float]] = []

    def record(self, step: int, loss: torch.Tensor, values: List[torch.Tensor]):
        vals = torch.stack([v.detach().double().reshape(()) for v in [loss] + values])
        bad = ~torch.isfinite(vals).all()
        self.first_bad = torch.where((self.first_bad < 0) & bad, self.step_t, self.first_bad)
        self.step_t += 1
        self.pending.append(vals)
        self.pending_steps.append(step)

    def flush(self) -> Optional[Dict[str, float]]:
        """Host read. Returns the last record; raises _Bad(step) when a non-finite loss was seen."""
        if not self.pending:
            return self.history[-1] if self.history else None
        rows = torch.stack(self.pending).tolist()
        first_bad = int(self.first_bad)
        for st, row in zip(self.pending_steps, rows):
            self.history.append({"stage": self.stage, "step": st,
                                 **dict(zip(["loss"] + self.keys, row))})
        self.pending, self.pending_steps = [], []
        if first_bad >= 0:
            raise _Bad(first_bad)
        return self.history[-1]


class _Bad(Exception):
    def __init__(self, step):
        self.step = step


def _bar(total, initial, desc, progress):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, disable=not progress, leave=True,
                dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------- 1
def _end_step(step, total, mon, bar, log_every, checkpoint_every, checkpoint_fn, state, postfix):
    """Shared end of a Stage-1/Stage-2 step: progress bar; every ``log_every`` steps (and at a
    checkpoint or the last step) read the logged device values back (the only host sync, which is
    also where non-finite losses are detected) and show ``postfix(last)``; write a checkpoint every
    ``checkpoint_every`` steps."""
    bar.update(1)
    ckpt_now = checkpoint_fn is not None and checkpoint_every and step % checkpoint_every == 0
    if step % log_every == 0 or step == total or ckpt_now:
        bar.set_postfix(refresh=False, **postfix(mon.flush()))
    if ckpt_now and step < total:
        checkpoint_fn(step, state(step))


def stage1(model: torch.nn.Module, splits: Splits, config: Stage1Config, *,
           device: Optional[torch.device] = None, seed: int = 0, c0: Optional[float] = None,
           eval_batch_size: int = 512, log_every: int = 10, checkpoint_every: int = 0,
           checkpoint_fn: Optional[Callable[[int, Dict[str, Any]], str]] = None,
           resume_state: Optional[Dict[str, Any]] = None, progress: bool = True) -> StageResult:
    """Stage 1 of method.md: minimise −L_f(θ) s.t. L_rem(θ) = L_rem(θ0), augmented Lagrangian.

    Each step draws one D_rem minibatch (the step budget is ``config.epochs`` passes over the
    D_rem stream, method.md: one) and one D_f minibatch (the forget stream cycles), computes
    g = mean CE(remote) − c0, the clipped forget term −mean(clippedCE) (no gradient for CE ≥ c;
    optionally minus the ToxiGen confidence penalty 1/(CE+ε) inside the mean), loss = forget term +
    λ·g + (μ/2)·g², takes one Adam step and updates λ ← λ + μ·g (g before the step for
    ``dual_update="pre"``, re-evaluated on the same remote batch after it for "post").

    Args:
        model: classifier returning (B, C) logits; updated in place, left in eval mode. Any dtype.
        splits: uses ``forget`` and ``remote`` (train parts).
        config: `Stage1Config`.
        device: where batches go (default: the model's parameter device).
        seed: data-order seed. c0: precomputed L_rem(θ0) in nats (computed here, no grad, over
            the whole remote set, when None).
        log_every: host-read interval (tqdm postfix, history, NaN check).
        checkpoint_every, checkpoint_fn: every that many steps call ``checkpoint_fn(step, state)``.
        resume_state: a state dict previously passed to checkpoint_fn (continues from it).
    Returns:
        StageResult(stage=1, steps, history (loss, violation g, λ, forget CE, remote CE), lam, c0).
    Raises:
        NonFiniteLossError: a loss became NaN/Inf (says the step; last good checkpoint kept).
        ValueError: empty splits, non 2-D logits.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    if c0 is None:
        c0 = remote_loss_c0(model, splits.remote, device, eval_batch_size)
    params = trainable_params(model)
    opt = torch.optim.Adam(params, lr=config.lr, betas=tuple(config.adam_betas), eps=config.adam_eps)
    dtype = params[0].dtype
    lam = torch.full((), float(config.lambda_init), dtype=dtype, device=device)
    c0_t = torch.full((), float(c0), dtype=dtype, device=device)   # fill: no H2D copy
    mu_t = torch.full((), float(config.mu), dtype=dtype, device=device)
    rem = BatchStream(splits.remote, config.remote_batch_size, shuffle=True, seed=seed,
                      name="s1/remote", device=device)
    fgt = BatchStream(splits.forget, config.forget_batch_size, shuffle=True, seed=seed,
                      name="s1/forget", device=device)
    per_epoch = len(rem)
    total = per_epoch * config.epochs
    start = 0
    if resume_state is not None:
        model.load_state_dict(resume_state["model"])
        opt.load_state_dict(resume_state["optimizer"])
        lam.copy_(resume_state["lam"].to(device))
        fgt.load_state(resume_state["forget_stream"])
        start = int(resume_state["step"])
        c0 = float(resume_state["c0"])
        c0_t.fill_(c0)
    mon = _Monitor(1, ["violation", "lambda", "forget_ce", "remote_ce"], device, start)
    if resume_state is not None:
        mon.history = list(resume_state.get("history", []))

    def state(step):
        return {"stage": 1, "step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "lam": lam.detach().clone(), "c0": c0, "forget_stream": fgt.state(),
                "history": list(mon.history)}

    bar = _bar(total, start, "stage 1 (AL)", progress)
    step = start
    try:
        while step < total:
            epoch, pos = divmod(step, per_epoch)
            for rb in rem.epoch_batches(epoch, pos):
                fb = fgt.next()
                nr = batch_size_of(rb)
                both = concat_batches([rb, fb])
                if both is not None:   # one forward pass (exact: eval mode)
                    ce = per_sample_ce(model, both)
                    ce_r, ce_f = ce[:nr], ce[nr:]
                else:
                    ce_r, ce_f = per_sample_ce(model, rb), per_sample_ce(model, fb)
                g = ce_r.mean() - c0_t
                clipped = torch.where(ce_f < config.clip, ce_f, ce_f.detach())
                obj = clipped
                if config.confidence_penalty:
                    obj = clipped - 1.0 / (clipped + config.penalty_eps)
                loss = -obj.mean() + augmented_lagrangian_term(g.reshape(1), lam.view(1), mu_t)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                lam_before = lam.detach().clone()
                if config.dual_update == "pre":
                    # λ is 0-d (one constraint); the ops take (m,) views of it, updated in place.
                    # check_finite=False: no host sync; NaN is caught at the next log point.
                    dual_update_(lam.view(1), g.detach().reshape(1), mu_t, check_finite=False)
                else:
                    with torch.no_grad():
                        g_post = per_sample_ce(model, rb).mean() - c0_t
                    dual_update_(lam.view(1), g_post.reshape(1), mu_t, check_finite=False)
                mon.record(step, loss, [g.detach(), lam_before, ce_f.detach().mean(), ce_r.detach().mean()])
                step += 1
                _end_step(step, total, mon, bar, log_every, checkpoint_every, checkpoint_fn, state,
                          lambda last: dict(loss=f"{last['loss']:.3f}", viol=f"{last['violation']:+.3f}",
                                            lam=f"{last['lambda']:.3f}"))
            mon.flush()
    except _Bad as bad:
        bar.close()
        raise NonFiniteLossError(1, bad.step, getattr(checkpoint_fn, "last_path", None)) from None
    bar.close()
    return StageResult(stage=1, steps=step, history=mon.history, lam=lam, c0=c0)


# ---------------------------------------------------------------------------------------------- 2
def _chunks(batches: List[Any], micro_batch: Optional[int]):
    """Group batches into forward passes: one concatenated pass (micro_batch None), slices of at
    most micro_batch samples, or one pass per batch when shapes cannot be concatenated."""
    cat = concat_batches(batches) if len(batches) > 1 else batches[0]
    if cat is None:
        return batches
    n = batch_size_of(cat)
    if micro_batch is None or micro_batch >= n:
        return [cat]
    return [slice_batch(cat, i, min(i + micro_batch, n)) for i in range(0, n, micro_batch)]


def _w2(a: torch.Tensor, b: torch.Tensor, sizes: List[int], per_batch: bool) -> torch.Tensor:
    """Σ over segments of W2²(a_seg, b_seg) in ONE operator call (dense (S, n) or ragged)."""
    fn = _ee.wasserstein2_1d if _ee.available() else None
    if fn is None:
        warnings.warn("entangle_ext native extension not loaded; using the pure-PyTorch W2 reference",
                      RuntimeWarning, stacklevel=3)
        fn = _ee.reference.wasserstein2_1d
        kw = {}
    else:
        kw = {"validate": False}
    if not per_batch or len(sizes) == 1:
        return fn(a, b, reduction="sum", **kw)
    if all(s == sizes[0] for s in sizes):
        S, n = len(sizes), sizes[0]
        return fn(a.view(S, n), b.view(S, n), reduction="sum", **kw)
    off = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0).tolist()), dtype=torch.long)
    off = off.to(a.device, non_blocking=True)   # host-known sizes: async copy, no stream sync
    if fn is _ee.reference.wasserstein2_1d:
        return fn(a, b, off, off, reduction="sum")
    return fn(a, b, off, off, reduction="sum", max_seqlen=max(sizes), **kw)


def _add_(acc, grads):
    if acc is None:
        return [g.clone() if g is not None else None for g in grads]
    torch._foreach_add_(acc, list(grads))
    return acc


def _grads(loss, params):
    gs = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(gs, params)]


def forget_objective(a: torch.Tensor, b: torch.Tensor, sizes: List[int], config: Stage2Config):
    """L̃_f of Stage 2 given a = −ℓ(θ) and b = −ℓ(θ̄) (N,) over the concatenated forget batches
    of ``sizes``: Σ_batches[(1−α)·mean(sign·ℓ) + α·W2²(a, b)] (reference, w2_scope="minibatch") or
    (1−α)·mean(sign·ℓ) + α·W2² over all N samples (w2_scope="forget_set").
    Returns (objective, Σ W2², mean forget CE), 0-d tensors."""
    per_batch = config.w2_scope == "minibatch"
    ell = -a
    sign = float(config.forget_mean_sign)
    if per_batch:
        if all(s == sizes[0] for s in sizes):
            mean_term = ell.view(len(sizes), sizes[0]).mean(1).sum()
        else:
            w = torch.cat([torch.full((s,), 1.0 / s, dtype=ell.dtype) for s in sizes]).to(ell.device, non_blocking=True)
            mean_term = (w * ell).sum()
    else:
        mean_term = ell.mean()
    w2 = _w2(a, b, sizes, per_batch)
    obj = (1.0 - config.alpha) * sign * mean_term + config.alpha * w2
    return obj, w2, ell.detach().mean()


def _forget_grad(model, ref_model, params, batches, config: Stage2Config):
    sizes = [batch_size_of(b) for b in batches]
    chunks = _chunks(batches, config.micro_batch)
    with torch.no_grad():
        b_ref = torch.cat([-per_sample_ce(ref_model, c) for c in chunks])
    if len(chunks) == 1:
        a = -per_sample_ce(model, chunks[0])
        obj, w2, mce = forget_objective(a, b_ref, sizes, config)
        return _grads(obj, params), obj.detach(), w2.detach(), mce
    # two passes: d obj / d ℓ from a no-grad pass, then Σ_chunks ∇(w·ℓ) (exact, bounded memory)
    with torch.no_grad():
        a0 = torch.cat([-per_sample_ce(model, c) for c in chunks])
    a0.requires_grad_(True)
    with torch.enable_grad():
        obj, w2, mce = forget_objective(a0, b_ref, sizes, config)
        (w,) = torch.autograd.grad(obj, a0)
    acc, off = None, 0
    for c in chunks:
        n = batch_size_of(c)
        acc = _add_(acc, _grads((w[off:off + n] * -per_sample_ce(model, c)).sum(), params))
        off += n
    return acc, obj.detach(), w2.detach(), mce


def _remote_grad(model, params, batches, micro_batch):
    sizes = [batch_size_of(b) for b in batches]
    wts = torch.cat([torch.full((s,), 1.0 / s) for s in sizes])
    acc, off, total = None, 0, None
    for c in _chunks(batches, micro_batch):
        ce = per_sample_ce(model, c)
        n = ce.shape[0]
        l = (wts[off:off + n].to(ce.device, ce.dtype, non_blocking=True) * ce).sum()
        acc = _add_(acc, _grads(l, params))
        total = l.detach() if total is None else total + l.detach()
        off += n
    return acc, total / len(sizes)


def stage2(model: torch.nn.Module, splits: Splits, config: Stage2Config, *,
           device: Optional[torch.device] = None, seed: int = 0, log_every: int = 10,
           checkpoint_every: int = 0,
           checkpoint_fn: Optional[Callable[[int, Dict[str, Any]], str]] = None,
           resume_state: Optional[Dict[str, Any]] = None, progress: bool = True) -> StageResult:
    """Stage 2 of method.md, W-PGD: repair D_adj while keeping D_f forgotten and D_rem intact.

    θ̄ = frozen copy of ``model`` at entry. For each D_adj minibatch (``config.epochs`` passes):
    g_adj = ∇ mean CE(adjacent batch); g_f = ∇ L̃_f over up to ``forget_batch_limit`` forget
    batches (see `forget_objective`; the W2² of all of them in one `entangle_ext.wasserstein2_1d`
    call, reference losses ℓ(θ̄) on the same samples under no_grad); g_rem = ∇ Σ_b mean CE over up
    to ``remote_batch_limit`` remote batches; v ← m·v + g_adj (or v = g_adj without momentum);
    v ← v − Vᵀ(VVᵀ)⁺Vv with V = [g_f; g_rem] over all trainable parameters; .grad = v; SGD step.
    Forget/remote batches come from a fresh shuffled pass of their streams at every step.

    Args:
        model: classifier returning (B, C) logits; updated in place, left in eval mode.
        splits: uses the ``adjacent``, ``forget`` and ``remote`` train parts.
        config: `Stage2Config`. Other arguments as `stage1`; resume_state also restores θ̄ and v.
    Returns:
        StageResult(stage=2, steps, history (loss = adjacent CE, forget objective, W2², forget CE,
        remote CE, projection coefficients c_f, c_rem), momentum).
    Raises:
        NonFiniteLossError, ValueError: as `stage1`.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    params = trainable_params(model)
    ref_model = copy.deepcopy(model).eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(params, lr=config.lr, momentum=0.0)
    v = [torch.zeros_like(p) for p in params]
    adj = BatchStream(splits.adjacent, config.adjacent_batch_size, shuffle=True, seed=seed,
                      name="s2/adjacent", device=device)
    fgt = BatchStream(splits.forget, config.forget_batch_size, shuffle=True, seed=seed,
                      name="s2/forget", device=device)
    rem = BatchStream(splits.remote, config.remote_batch_size, shuffle=True, seed=seed,
                      name="s2/remote", device=device)
    per_epoch = len(adj)
    total = per_epoch * config.epochs
    start = 0
    if resume_state is not None:
        model.load_state_dict(resume_state["model"])
        ref_model.load_state_dict(resume_state["ref_model"])
        opt.load_state_dict(resume_state["optimizer"])
        for vi, si in zip(v, resume_state["momentum"]):
            vi.copy_(si)
        start = int(resume_state["step"])
    mon = _Monitor(2, ["forget_obj", "w2", "forget_ce", "remote_ce", "c_f", "c_rem"], device, start)
    if resume_state is not None:
        mon.history = list(resume_state.get("history", []))

    def state(step):
        return {"stage": 2, "step": step, "model": model.state_dict(),
                "ref_model": ref_model.state_dict(), "optimizer": opt.state_dict(),
                "momentum": [t.detach().clone() for t in v], "history": list(mon.history)}

    bar = _bar(total, start, "stage 2 (W-PGD)", progress)
    step = start
    try:
        while step < total:
            epoch, pos = divmod(step, per_epoch)
            for ab in adj.epoch_batches(epoch, pos):
                l_adj = per_sample_ce(model, ab).mean()
                g_adj = _grads(l_adj, params)
                fb = [fgt.fetch(i) for i in fgt.batch_indices(step)[:config.forget_batch_limit]]
                g_f, f_obj, w2, f_ce = _forget_grad(model, ref_model, params, fb, config)
                rb = [rem.fetch(i) for i in rem.batch_indices(step)[:config.remote_batch_limit]]
                g_rem, r_ce = _remote_grad(model, params, rb, config.micro_batch)
                with torch.no_grad():
                    if config.use_momentum:
                        torch._foreach_mul_(v, config.momentum)
                        torch._foreach_add_(v, g_adj)
                    else:
                        torch._foreach_copy_(v, g_adj) if hasattr(torch, "_foreach_copy_") else \
                            [vi.copy_(gi) for vi, gi in zip(v, g_adj)]
                    coeffs = project_orthogonal_(v, [g_f, g_rem], rcond=config.rcond)
                    for p, vi in zip(params, v):
                        p.grad = vi.clone()
                opt.step()
                for p in params:
                    p.grad = None
                mon.record(step, l_adj, [f_obj, w2, f_ce, r_ce, coeffs[0], coeffs[1]])
                step += 1
                _end_step(step, total, mon, bar, log_every, checkpoint_every, checkpoint_fn, state,
                          lambda last: dict(adj=f"{last['loss']:.3f}", w2=f"{last['w2']:.2e}",
                                            f_ce=f"{last['forget_ce']:.2f}"))
            mon.flush()
    except _Bad as bad:
        bar.close()
        raise NonFiniteLossError(2, bad.step, getattr(checkpoint_fn, "last_path", None)) from None
    bar.close()
    return StageResult(stage=2, steps=step, history=mon.history, momentum=v)
