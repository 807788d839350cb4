"""Stage 1 (augmented Lagrangian, docs/algorithm.md §2) and Stage 2 (W-PGD, docs/algorithm.md §3):
Stage 2 is defined here; Stage 1 in ``stage1_al.py`` and what both read in ``stage_common.py``
beside this file, both re-exported here.

Each stage is a step function run by `StageLoop` (progress bar, logging, checkpoints, resume,
interrupts). Both keep the model in eval mode (BatchNorm statistics frozen, dropout off) and never
read device values back to the host inside a step: logged scalars stay on the device and are read
every ``log_every`` steps, which is also when non-finite losses are detected. Precision
(float16/bfloat16 models, ``amp``): see ``entangle_ext/unlearn/precision.py``. Under several ranks
(``torchrun``; DDP, FSDP or a plain replicated module) the same steps run on each rank's part of
every global batch with the reductions of ``entangle_ext/unlearn/distributed.py`` (docs/algorithm.md
§11).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional

import torch

from ..projection import project_orthogonal_
from .checkpoint import optimizer_entry
from .config import Stage2Config
from .data import Splits
from .distributed import Dist, scope
from .inputs import check_stage_arguments, model_device, require_one_dtype, require_trainable, training_grad_mode
from .loop import NonFiniteLossError, StageLoop, StageResult, updating
from .losses import auto_micro_batch, forget_grad, grads_of, mean_ce, per_sample_ce, remote_grad, trainable_params
from .precision import MasterParams, amp_scope, resolve_amp_for, state_dtype
from .stage1_al import stage1
from .stage_common import CheckpointFn, reference_losses, remote_loss_c0, train_stream

__all__ = ["stage1", "stage2", "remote_loss_c0", "reference_losses", "NonFiniteLossError",
           "StageResult", "trainable_params", "per_sample_ce"]


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of a dense tensor in memory order (no copy): writes through it change ``t``."""
    if t.is_contiguous():
        return t.view(-1)
    perm = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
    return t.permute(perm).view(-1)   # RuntimeError if not dense (never for our buffers)


def _like(grads: List[torch.Tensor], ref: List[torch.Tensor]) -> List[torch.Tensor]:
    """``grads`` with the dtype and strides of ``ref`` (the momentum buffer: the parameters'
    layout, float32 at least); tensors that already match are not copied."""
    return [g if g.dtype == r.dtype and g.stride() == r.stride() else torch.empty_like(r).copy_(g)
            for g, r in zip(grads, ref)]


def _projection_kwargs(config: Stage2Config) -> Dict[str, Any]:
    """rcond and the per-tensor Gram ridge, each when set (docs/algorithm.md §5, §7)."""
    kw: Dict[str, Any] = {} if config.rcond is None else {"rcond": config.rcond}
    if config.gram_ridge is not None:
        kw["ridge"] = config.gram_ridge
    return kw


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP), the tensor itself otherwise (no copy)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _momentum_and_project_(v: List[torch.Tensor], g_adj: List[torch.Tensor], basis,
                           config: Stage2Config, proj_kw: Dict[str, Any], d: Dist) -> torch.Tensor:
    """v ← m·v + g_adj (or v = g_adj without momentum), then v ← v − Vᵀ(VVᵀ)⁺Vv in place
    (docs/algorithm.md §5) on memory-order views (v, g_adj and the basis share their strides).
    A sharded model projects each rank's shards, joined by one all-reduce of VVᵀ and Vv
    (``process_group``, docs/algorithm.md §11). Returns the projection coefficients, shape (k,)."""
    with torch.no_grad():
        v, g_adj, *basis = ([_local(t) for t in ts] for ts in (v, g_adj, *basis))   # FSDP: shards
        if config.use_momentum:
            torch._foreach_mul_(v, config.momentum)
            torch._foreach_add_(v, g_adj)
        else:
            torch._foreach_copy_(v, g_adj)
        flat = [[_memory_order(t) for t in ts] for ts in (v, *basis)]
        if d.kind == "sharded":
            proj_kw = dict(proj_kw, process_group=d.group)
        return project_orthogonal_(flat[0], flat[1:], **proj_kw)


class _Basis:
    """The cached projection basis of ``basis_every = r > 1`` (docs/algorithm.md §3, "basis_every
    (ours)"): g_f and g_rem in the momentum buffer's dtype and layout, and the four values logged
    with them (forget objective, W2², forget CE, remote CE; float64, 0-d). A run object (saved in
    every mid-stage checkpoint, restored on resume); ``valid`` is False until the first refresh
    or a restore (a checkpoint without a basis, i.e. written with r = 1, leaves it False: the
    first resumed step refreshes)."""

    def __init__(self, v: List[torch.Tensor]):
        self.g_f = [torch.zeros_like(t) for t in v]
        self.g_rem = [torch.zeros_like(t) for t in v]
        self.logged = [torch.zeros((), dtype=torch.float64, device=v[0].device) for _ in range(4)]
        self.valid = False

    def store(self, g_f, g_rem, logged) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.g_f, g_f)
            torch._foreach_copy_(self.g_rem, g_rem)
            for t, x in zip(self.logged, logged):
                t.copy_(x.detach().double().reshape(()))
        self.valid = True

    def state_dict(self) -> Dict[str, Any]:
        return {"g_f": [t.detach().clone() for t in self.g_f],
                "g_rem": [t.detach().clone() for t in self.g_rem],
                "logged": [t.clone() for t in self.logged], "valid": self.valid}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        with torch.no_grad():
            for mine, theirs in ((self.g_f, state["g_f"]), (self.g_rem, state["g_rem"]),
                                 (self.logged, state["logged"])):
                if len(mine) != len(theirs):
                    raise ValueError(f"checkpoint holds a basis of {len(theirs)} tensors where the "
                                     f"run has {len(mine)}")
                for t, x in zip(mine, theirs):
                    t.copy_(x)
        self.valid = bool(state["valid"])


def _stage2_step(model, ref: torch.Tensor, params, master: MasterParams, opt, v, streams,
                 config: Stage2Config, d: Dist, basis: Optional[_Basis] = None):
    """The step function of Stage 2 on one adjacent batch ``ab`` (see `stage2`): every forward
    pass first, then v, the parameters (and their float32 copies) change. ``ref`` holds −ℓ(θ̄) of
    every forget sample (`reference_losses`). ``micro_batch="auto"`` is resolved once, on the
    first forget batch of the first step that computes a basis (`auto_micro_batch`).

    ``basis`` (``basis_every = r > 1`` only): step i recomputes g_f, g_rem from pass i // r of the
    forget/remote streams when i % r == 0 (or no basis is cached yet) and stores them in
    ``basis``; other steps project onto the cached ones and log the cached values, plus a
    ``basis_refreshed`` flag (1 / 0). Without ``basis`` (r = 1) every step uses pass i, as the
    reference."""
    forget, remote = streams
    proj_kw = _projection_kwargs(config)
    r = config.basis_every
    if basis is not None:
        flags = [torch.full((), float(x), dtype=torch.float64, device=v[0].device) for x in (0, 1)]

    def fresh(i):
        """g_f, g_rem and the logged [f_obj, w2, f_ce, r_ce] from pass ``i`` of the streams."""
        nonlocal config
        # w2_scope "forget_set" (paper text): the whole forget set, every batch of the pass
        limit = config.forget_batch_limit if config.w2_scope == "minibatch" else len(forget)
        fidx = forget.pass_indices(i, limit)
        b_ref = ref[torch.cat(fidx).to(ref.device, non_blocking=True)]
        f_batches = forget.fetch_pass(i, limit)
        if config.micro_batch == "auto":   # off the CPU one pass; over the whole forget set no
            # larger a pass than a reference step's (its forget_batch_limit batches), exact in chunks
            mb = auto_micro_batch(model, f_batches[0])
            if mb is None and config.w2_scope == "forget_set":
                mb = config.forget_batch_size * config.forget_batch_limit
            config = dataclasses.replace(config, micro_batch=mb)
        g_f, f_obj, w2, f_ce = forget_grad(model, params, f_batches, b_ref,
                                           [len(x) for x in fidx], config)
        r_sizes = [len(x) for x in remote.pass_indices(i, config.remote_batch_limit)]
        g_rem, r_ce = remote_grad(model, params, remote.fetch_pass(i, config.remote_batch_limit),
                                  r_sizes, config.micro_batch)
        return g_f, g_rem, [f_obj, w2, f_ce, r_ce]

    def step(i, ab):
        l_adj = mean_ce(model, ab)
        g_adj = grads_of(l_adj, params)
        refresh = basis is None or i % r == 0 or not basis.valid
        if basis is None:
            g_f, g_rem, logged = fresh(i)
        elif refresh:
            g_f, g_rem, logged = fresh(i // r)
        else:
            g_f, g_rem, logged = basis.g_f, basis.g_rem, basis.logged
        extra = [] if basis is None else [flags[int(refresh)]]
        with updating():
            g_f, g_rem = _like(g_f, v), _like(g_rem, v)
            if basis is not None and refresh:
                basis.store(g_f, g_rem, logged)
            coeffs = _momentum_and_project_(v, _like(g_adj, v), [g_f, g_rem], config, proj_kw, d)
            master.step(opt, v)
        return l_adj, [*logged, coeffs[0], coeffs[1], *extra]
    return step


@training_grad_mode()
def stage2(model: torch.nn.Module, splits: Splits, config: Stage2Config, *,
           device: Optional[torch.device] = None, seed: int = 0, eval_batch_size: int = 512,
           log_every: int = 10,
           checkpoint_every: int = 0, checkpoint_fn: Optional[CheckpointFn] = None,
           resume_state: Optional[Dict[str, Any]] = None, progress: bool = True,
           amp: Optional[str] = None, probe: Optional[Callable[[int], bool]] = None,
           probe_every: int = 0) -> StageResult:
    """Stage 2 (docs/algorithm.md §3), W-PGD: repair D_adj while keeping D_f forgotten and D_rem
    intact.

    θ̄ = ``model`` at entry: the reference losses ℓ(θ̄) of every forget sample are computed once
    there (`reference_losses`, no grad, ``eval_batch_size`` samples per pass; one draw per sample
    of a dataset with random transforms). For each D_adj
    minibatch (``config.epochs`` passes): g_adj = ∇ mean CE(adjacent batch); g_f = ∇ L̃_f over up
    to ``forget_batch_limit`` forget batches (``w2_scope="forget_set"``: every batch of the pass,
    the whole forget set; see `forget_objective`; the W2² of all of them in
    one `entangle_ext.wasserstein2_1d` call against ℓ(θ̄) of the same samples); g_rem = ∇ Σ_b mean CE over up
    to ``remote_batch_limit`` remote batches; v ← m·v + g_adj (or v = g_adj without momentum);
    v ← v − Vᵀ(VVᵀ)⁺Vv with V = [g_f; g_rem] over all trainable parameters (with the per-tensor
    Gram ridge ``gram_ridge`` where the projection operator supports it); SGD step θ ← θ − η·v.
    Forget/remote batches come from a fresh shuffled pass of their streams at every step.
    ``basis_every = r > 1`` (ours, docs/algorithm.md §3 "basis_every (ours)"): g_f and g_rem (the
    W2² term included: it is part of g_f) are recomputed at steps 0, r, 2r, ... only, from pass
    i // r of the forget/remote streams, and cached in between (in every mid-stage checkpoint);
    the history gains a ``basis_refreshed`` column (1 / 0).

    Args:
        model: classifier returning (B, C) logits; updated in place, left in eval mode. Any
            memory format (e.g. channels_last) and parameter strides; the momentum buffer v has
            each parameter's layout, in float32 at least (float16/bfloat16 parameters are stepped
            through float32 master copies).
        splits: uses the ``adjacent``, ``forget`` and ``remote`` train parts.
        config: `Stage2Config` (validated here). Other arguments as `stage1`; resume_state also
            restores ℓ(θ̄) and v.
    Returns:
        StageResult(stage=2, steps, history (loss = adjacent CE, forget objective, W2², forget CE,
        remote CE, projection coefficients c_f, c_rem), momentum).
    Raises:
        NonFiniteLossError, RunInterrupted, ValueError: as `stage1`.
    """
    check_stage_arguments("stage2", model, splits, config, Stage2Config, seed=seed, checkpoint_fn=checkpoint_fn,
                          progress=progress)
    config.validate()
    require_one_dtype(require_trainable(model), model)
    device = model_device(model, device)
    loop = StageLoop(2, "stage 2 (W-PGD)",
                     ["forget_obj", "w2", "forget_ce", "remote_ce", "c_f", "c_rem"]
                     + (["basis_refreshed"] if config.basis_every > 1 else []),
                     postfix=lambda last: dict(adj=f"{last['loss']:.3f}", w2=f"{last['w2']:.2e}",
                                               f_ce=f"{last['forget_ce']:.2f}"),
                     log_every=log_every, checkpoint_every=checkpoint_every,
                     checkpoint_fn=checkpoint_fn, progress=progress, probe=probe, probe_every=probe_every)
    with scope(model) as (d, model), amp_scope(resolve_amp_for(amp, model, device)):
        return _run_stage2(d, model, splits, config, loop, device=device, seed=seed,
                           eval_batch_size=eval_batch_size, resume_state=resume_state)


def _run_stage2(d: Dist, model, splits: Splits, config: Stage2Config, loop: StageLoop, *, device,
                seed: int, eval_batch_size: int,
                resume_state: Optional[Dict[str, Any]]) -> StageResult:
    """The body of `stage2` inside its distributed and precision scopes."""
    params = require_trainable(model)
    model.eval()
    if resume_state is not None:
        ref = resume_state["ref_losses"].to(device)
    else:
        ref = reference_losses(model, splits.source("forget"), device, eval_batch_size)
    loop.extra["ref_losses"] = ref
    master = MasterParams(params)
    opt = torch.optim.SGD(master.tensors, lr=config.lr, momentum=0.0)
    v = [torch.zeros_like(p, dtype=state_dtype(p.dtype)) for p in params]
    adjacent, forget, remote = (
        train_stream(splits, name, bs, model, seed, f"s2/{name}", device)
        for name, bs in (("adjacent", config.adjacent_batch_size),
                         ("forget", config.forget_batch_size),
                         ("remote", config.remote_batch_size)))
    objects = {"model": model, "optimizer": optimizer_entry(opt), "momentum": v}
    if master.low:
        objects["master"] = master.tensors
    basis = _Basis(v) if config.basis_every > 1 else None
    if basis is not None:
        objects["basis"] = basis
        if resume_state is not None and "basis" not in resume_state:   # written with r = 1
            resume_state = {**resume_state, "basis": basis.state_dict()}   # first step refreshes
    step = _stage2_step(model, ref, params, master, opt, v, (forget, remote), config, d, basis)
    try:
        steps, history = loop.run(adjacent, config.epochs, step, device=device,
                                  resume_state=resume_state, objects=objects)
    finally:
        for s in (adjacent, forget, remote):
            s.close()
    return StageResult(stage=2, steps=steps, history=history, momentum=v)
