"""Stage 1 (augmented Lagrangian, docs/algorithm.md §2) and Stage 2 (W-PGD, docs/algorithm.md §3).

Each stage is a step function run by `StageLoop` (progress bar, logging, checkpoints, resume).
Both keep the model in eval mode (BatchNorm statistics frozen, dropout off) and never read device
values back to the host inside a step: logged scalars stay on the device and are read every
``log_every`` steps, which is also when non-finite losses are detected.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

import torch

from ..lagrangian import AugmentedLagrangian
from ..projection import project_orthogonal_
from .config import Stage1Config, Stage2Config
from .data import BatchStream, Splits, batch_size_of, concat_batches
from .loop import NonFiniteLossError, StageLoop, StageResult
from .losses import forget_grad, grads_of, per_sample_ce, remote_grad, trainable_params

__all__ = ["stage1", "stage2", "remote_loss_c0", "NonFiniteLossError", "StageResult",
           "trainable_params", "per_sample_ce"]

CheckpointFn = Callable[[int, Dict[str, Any]], Optional[str]]


@torch.no_grad()
def remote_loss_c0(model: torch.nn.Module, dataset, device, batch_size: int = 512) -> float:
    """c0 = mean CE (nats) of ``model`` over the whole dataset (docs/algorithm.md §2), no grad.

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


def _remote_and_forget_ce(model, rb, fb):
    """Per-sample CE of a remote and a forget batch, in one forward pass when they concatenate
    (exact in eval mode)."""
    both = concat_batches([rb, fb])
    if both is None:
        return per_sample_ce(model, rb), per_sample_ce(model, fb)
    ce = per_sample_ce(model, both)
    nr = batch_size_of(rb)
    return ce[:nr], ce[nr:]


def _stage1_forget_term(ce_f: torch.Tensor, config: Stage1Config) -> torch.Tensor:
    """−mean of the clipped forget CE (no gradient where CE ≥ clip), optionally with the ToxiGen
    confidence penalty 1/(CE + ε) subtracted inside the mean."""
    clipped = torch.where(ce_f < config.clip, ce_f, ce_f.detach())
    obj = clipped - 1.0 / (clipped + config.penalty_eps) if config.confidence_penalty else clipped
    return -obj.mean()


def _make_lagrangian(config: Stage1Config, c0: float, dtype, device) -> AugmentedLagrangian:
    """λ, μ and c0 in the model's dtype on its device; no host read inside the steps."""
    al = AugmentedLagrangian(torch.full((1,), float(c0), dtype=dtype, device=device), mu=config.mu,
                             update_with=config.dual_update, check_finite=False)
    al.lam.fill_(float(config.lambda_init))
    return al


def _stage1_step(model, opt, al: AugmentedLagrangian, forget: BatchStream, config: Stage1Config):
    """The step function of Stage 1 on one remote batch ``rb`` (see `stage1`)."""
    def step(_, rb):
        ce_r, ce_f = _remote_and_forget_ce(model, rb, forget.next())
        g = al.constraint(ce_r.mean())
        loss = _stage1_forget_term(ce_f, config) + al.penalty(g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lam = al.lam.detach().clone()   # the λ of this step's loss
        if al.update_with == "pre":
            al.update()                 # with the g of the loss
        else:
            al.update(closure=lambda: per_sample_ce(model, rb).mean())   # g after the step
        return loss, [g, lam, ce_f.mean(), ce_r.mean()]
    return step


def stage1(model: torch.nn.Module, splits: Splits, config: Stage1Config, *,
           device: Optional[torch.device] = None, seed: int = 0, c0: Optional[float] = None,
           eval_batch_size: int = 512, log_every: int = 10, checkpoint_every: int = 0,
           checkpoint_fn: Optional[CheckpointFn] = None,
           resume_state: Optional[Dict[str, Any]] = None, progress: bool = True) -> StageResult:
    """Stage 1 (docs/algorithm.md §2): minimise −L_f(θ) s.t. L_rem(θ) = L_rem(θ0) with an
    `AugmentedLagrangian` (one equality constraint, docs/algorithm.md §6).

    Each step draws one D_rem minibatch (the step budget is ``config.epochs`` passes over the
    D_rem stream; the paper: one) and one D_f minibatch (the forget stream cycles), computes
    g = mean CE(remote) − c0, the clipped forget term −mean(clippedCE) (no gradient for CE ≥ c;
    optionally minus the ToxiGen confidence penalty 1/(CE+ε) inside the mean), loss = forget term +
    λ·g + (μ/2)·g², takes one Adam step and updates λ ← λ + μ·g (g before the step for
    ``dual_update="pre"``, re-evaluated on the same remote batch after it for "post").

    Args:
        model: classifier returning (B, C) logits; updated in place, left in eval mode. λ, μ and
            c0 are kept in the dtype of its first trainable parameter.
        splits: uses ``forget`` and ``remote`` (train parts).
        config: `Stage1Config` (validated here).
        device: where batches go (default: the model's parameter device).
        seed: data-order seed. c0: precomputed L_rem(θ0) in nats (computed here, no grad, over
            the whole remote set, when None).
        log_every: host-read interval (progress bar, history, NaN check).
        checkpoint_every, checkpoint_fn: every that many steps call ``checkpoint_fn(step, state)``.
        resume_state: a state dict previously passed to checkpoint_fn (continues from it, with
            its c0 and its λ, μ from its ``lagrangian`` entry).
    Returns:
        StageResult(stage=1, steps, history (loss, violation g, λ, forget CE, remote CE), lam, c0,
        lagrangian).
    Raises:
        NonFiniteLossError: a loss became NaN/Inf (says the step; last good checkpoint kept).
        ValueError: empty splits, non 2-D logits, an invalid config.
    """
    config.validate()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    if resume_state is not None:
        c0 = float(resume_state["c0"])
    elif c0 is None:
        c0 = remote_loss_c0(model, splits.remote, device, eval_batch_size)
    params = trainable_params(model)
    opt = torch.optim.Adam(params, lr=config.lr, betas=tuple(config.adam_betas), eps=config.adam_eps)
    al = _make_lagrangian(config, c0, params[0].dtype, device)
    remote = BatchStream(splits.remote, config.remote_batch_size, shuffle=True, seed=seed,
                         name="s1/remote", device=device)
    forget = BatchStream(splits.forget, config.forget_batch_size, shuffle=True, seed=seed,
                         name="s1/forget", device=device)
    step = _stage1_step(model, opt, al, forget, config)
    loop = StageLoop(1, "stage 1 (AL)", ["violation", "lambda", "forget_ce", "remote_ce"],
                     postfix=lambda last: dict(loss=f"{last['loss']:.3f}",
                                               viol=f"{last['violation']:+.3f}",
                                               lam=f"{last['lambda']:.3f}"),
                     log_every=log_every, checkpoint_every=checkpoint_every,
                     checkpoint_fn=checkpoint_fn, progress=progress, extra={"c0": c0})
    steps, history = loop.run(remote, config.epochs, step, device=device, resume_state=resume_state,
                              objects={"model": model, "optimizer": opt, "lagrangian": al,
                                       "forget_stream": forget})
    return StageResult(stage=1, steps=steps, history=history, lam=al.lam.reshape(()), c0=c0,
                       lagrangian=al)


def _momentum_and_project_(v: List[torch.Tensor], g_adj: List[torch.Tensor], basis,
                           config: Stage2Config) -> torch.Tensor:
    """v ← m·v + g_adj (or v = g_adj without momentum), then v ← v − Vᵀ(VVᵀ)⁺Vv in place
    (docs/algorithm.md §5). Returns the projection coefficients, shape (k,)."""
    with torch.no_grad():
        if config.use_momentum:
            torch._foreach_mul_(v, config.momentum)
            torch._foreach_add_(v, g_adj)
        else:
            torch._foreach_copy_(v, g_adj)
        kw = {} if config.rcond is None else {"rcond": config.rcond}
        return project_orthogonal_(v, basis, **kw)


def _sgd_step(opt: torch.optim.Optimizer, params, direction: List[torch.Tensor]) -> None:
    """One optimizer step along ``direction`` (copied into ``.grad``, cleared afterwards)."""
    for p, d in zip(params, direction):
        p.grad = d.clone()
    opt.step()
    for p in params:
        p.grad = None


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def stage2(model: torch.nn.Module, splits: Splits, config: Stage2Config, *,
           device: Optional[torch.device] = None, seed: int = 0, log_every: int = 10,
           checkpoint_every: int = 0, checkpoint_fn: Optional[CheckpointFn] = None,
           resume_state: Optional[Dict[str, Any]] = None, progress: bool = True) -> StageResult:
    """Stage 2 (docs/algorithm.md §3), W-PGD: repair D_adj while keeping D_f forgotten and D_rem
    intact.

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
        config: `Stage2Config` (validated here). Other arguments as `stage1`; resume_state also
            restores θ̄ and v.
    Returns:
        StageResult(stage=2, steps, history (loss = adjacent CE, forget objective, W2², forget CE,
        remote CE, projection coefficients c_f, c_rem), momentum).
    Raises:
        NonFiniteLossError, ValueError: as `stage1`.
    """
    config.validate()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    params = trainable_params(model)
    ref_model = _frozen_copy(model)
    opt = torch.optim.SGD(params, lr=config.lr, momentum=0.0)
    v = [torch.zeros_like(p) for p in params]
    adjacent, forget, remote = (
        BatchStream(getattr(splits, name), bs, shuffle=True, seed=seed, name=f"s2/{name}", device=device)
        for name, bs in (("adjacent", config.adjacent_batch_size),
                         ("forget", config.forget_batch_size), ("remote", config.remote_batch_size)))

    def step(i, ab):
        l_adj = per_sample_ce(model, ab).mean()
        g_adj = grads_of(l_adj, params)
        g_f, f_obj, w2, f_ce = forget_grad(model, ref_model, params,
                                           forget.fetch_pass(i, config.forget_batch_limit), config)
        g_rem, r_ce = remote_grad(model, params, remote.fetch_pass(i, config.remote_batch_limit),
                                  config.micro_batch)
        coeffs = _momentum_and_project_(v, g_adj, [g_f, g_rem], config)
        _sgd_step(opt, params, v)
        return l_adj, [f_obj, w2, f_ce, r_ce, coeffs[0], coeffs[1]]

    loop = StageLoop(2, "stage 2 (W-PGD)", ["forget_obj", "w2", "forget_ce", "remote_ce", "c_f", "c_rem"],
                     postfix=lambda last: dict(adj=f"{last['loss']:.3f}", w2=f"{last['w2']:.2e}",
                                               f_ce=f"{last['forget_ce']:.2f}"),
                     log_every=log_every, checkpoint_every=checkpoint_every,
                     checkpoint_fn=checkpoint_fn, progress=progress)
    steps, history = loop.run(adjacent, config.epochs, step, device=device, resume_state=resume_state,
                              objects={"model": model, "ref_model": ref_model, "optimizer": opt,
                                       "momentum": v})
    return StageResult(stage=2, steps=steps, history=history, momentum=v)
