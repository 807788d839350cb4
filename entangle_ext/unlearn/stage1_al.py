"""Stage 1 of the method: the augmented-Lagrangian ascent on the forget loss with the remote loss
pinned at c0 (docs/algorithm.md §2, §6). `stage1` runs it under `StageLoop`; the step keeps the
model in eval mode and reads no device value back to the host (``entangle_ext/unlearn/stages.py``
for the conventions both stages share)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from ..lagrangian import AugmentedLagrangian
from .checkpoint import Reconfigured, optimizer_entry
from .config import Stage1Config
from .data import BatchStream, Splits, batch_size_of
from .distributed import Dist, current, scope
from .inputs import check_stage_arguments, model_device, require_trainable, training_grad_mode
from .loop import StageLoop, StageResult, updating
from .losses import mean_ce, per_sample_ce
from .precision import MasterParams, amp_scope, resolve_amp_for, state_dtype
from .stage_common import CheckpointFn, remote_loss_c0, train_stream

__all__ = ["stage1"]


def _remote_and_forget_ce(model, rb, fb):
    """Per-sample CE of a remote and a forget batch, in one forward pass when they concatenate
    (exact in eval mode; on every rank, for a sharded model)."""
    both = current().concat([rb, fb])
    if both is None:
        return per_sample_ce(model, rb), per_sample_ce(model, fb)
    ce = per_sample_ce(model, both)
    nr = batch_size_of(rb)
    return ce[:nr], ce[nr:]


def _stage1_forget_samples(ce_f: torch.Tensor, config: Stage1Config) -> torch.Tensor:
    """Per-sample forget objective whose mean the forget term −mean(·) negates: the clipped CE
    (same value, no gradient where CE ≥ clip), optionally minus the ToxiGen confidence penalty
    κ/(ℓ + ε), on the unclipped CE (``penalty_on="ce"``, reference: its gradient reaches every
    sample) or on the clipped one (``"clipped"``: no gradient above the clip); docs/algorithm.md
    §2, §7."""
    clipped = torch.where(ce_f < config.clip, ce_f, ce_f.detach())
    obj = clipped
    if config.confidence_penalty:
        base = ce_f if config.penalty_on == "ce" else clipped
        obj = clipped - config.penalty_factor / (base + config.penalty_eps)
    return obj


def _make_lagrangian(config: Stage1Config, c0: float, dtype, device) -> AugmentedLagrangian:
    """λ, μ and c0 on the model's device in ``dtype`` (float32 or float64); no host read inside
    the steps."""
    al = AugmentedLagrangian(float(c0), mu=config.mu, update_with=config.dual_update,
                             check_finite=False, dtype=dtype, device=device)
    al.lam.fill_(float(config.lambda_init))
    return al


def _stage1_step(model, params, master: MasterParams, opt, al: AugmentedLagrangian,
                 forget: BatchStream, config: Stage1Config, d: Dist):
    """The step function of Stage 1 on one remote batch ``rb`` (see `stage1`). The forward passes
    come first; the run objects change only after them, inside `updating`. Means are over the
    global batches (`Dist.means`: g, hence λ, is the same on every rank)."""
    def step(_, rb):
        ce_r, ce_f = _remote_and_forget_ce(model, rb, forget.peek())
        l_rem, l_obj, l_f = d.means(ce_r, _stage1_forget_samples(ce_f, config), ce_f.detach())
        g = al.constraint(l_rem)
        loss = -l_obj + al.penalty(g)
        acc = d.grads(params, keep_none=True)
        acc.add(loss)
        grads = acc.result()
        with updating():
            forget.advance()
            master.step(opt, grads)
            lam = al.lam.detach().clone()   # the λ of this step's loss
            if al.update_with == "pre":
                al.update()                 # with the g of the loss
            else:
                al.update(closure=lambda: mean_ce(model, rb))   # g after the step
        return loss, [g, lam, l_f, l_rem]
    return step


@training_grad_mode()
def stage1(model: torch.nn.Module, splits: Splits, config: Stage1Config, *,
           device: Optional[torch.device] = None, seed: int = 0, c0: Optional[float] = None,
           eval_batch_size: int = 512, log_every: int = 10, checkpoint_every: int = 0,
           checkpoint_fn: Optional[CheckpointFn] = None,
           resume_state: Optional[Dict[str, Any]] = None, progress: bool = True,
           amp: Optional[str] = None, probe: Optional[Callable[[int], bool]] = None,
           probe_every: int = 0) -> StageResult:
    """Stage 1 (docs/algorithm.md §2): minimise −L_f(θ) s.t. L_rem(θ) = L_rem(θ0) with an
    `AugmentedLagrangian` (one equality constraint, docs/algorithm.md §6).

    Each step draws one D_rem minibatch (the step budget is ``config.epochs`` passes over the
    D_rem stream, capped by ``config.max_steps``) and one D_f minibatch (the forget stream cycles:
    the first pass's order replayed for ``forget_order="cycle"``, reshuffled each pass for
    "reshuffle"; docs/algorithm.md §7), computes g = mean CE(remote) − c0, the clipped forget term
    −mean(clippedCE) (no gradient for CE ≥ c; optionally minus the ToxiGen confidence penalty),
    loss = forget term + λ·g + (μ/2)·g², takes one Adam step and updates λ ← λ + μ·g (g before the
    step for ``dual_update="pre"``, re-evaluated on the same remote batch after it for "post").

    Args:
        model: classifier returning (B, C) logits; updated in place, left in eval mode. λ, μ and
            c0 are kept in float32, or float64 for a float64 model; float16/bfloat16 parameters
            are stepped through float32 master copies (Adam state in float32).
        splits: uses ``forget`` and ``remote`` (train parts).
        config: `Stage1Config` (validated here).
        device: where batches go (default: the model's parameter device).
        seed: data-order seed. c0: precomputed L_rem(θ0) in nats (computed here, no grad, over
            the whole remote set, when None).
        log_every: host-read interval (progress bar, history, NaN check).
        checkpoint_every, checkpoint_fn: every that many steps call ``checkpoint_fn(step, state)``.
        resume_state: a state dict previously passed to checkpoint_fn (continues from it, with
            its c0 and its λ, μ from its ``lagrangian`` entry).
        amp: None, "bf16" or "auto" (`resolve_amp`): forward passes under `torch.autocast` (see
            ``entangle_ext/unlearn/precision.py``).
        probe, probe_every: the curve probe of `StageLoop` (``entangle_ext/unlearn/loop.py``):
            called every ``probe_every`` steps and at the end; True ends the stage (a stopping
            rule). None (default): the fixed budget, nothing extra computed.
    Returns:
        StageResult(stage=1, steps, history (loss, violation g, λ, forget CE, remote CE), lam, c0,
        lagrangian).
    Raises:
        NonFiniteLossError: a loss became NaN/Inf (says the step; last good checkpoint kept).
        RunInterrupted: Ctrl-C / SIGTERM / SIGHUP (a checkpoint of the last completed step is written).
        ValueError: empty or missing splits, non 2-D logits, bad labels, no trainable
            parameters, an invalid config.
    """
    check_stage_arguments("stage1", model, splits, config, Stage1Config, seed=seed, c0=c0, checkpoint_fn=checkpoint_fn,
                          progress=progress)
    config.validate()
    require_trainable(model)
    device = model_device(model, device)
    loop = StageLoop(1, "stage 1 (AL)", ["violation", "lambda", "forget_ce", "remote_ce"],
                     postfix=lambda last: dict(loss=f"{last['loss']:.3f}",
                                               viol=f"{last['violation']:+.3f}",
                                               lam=f"{last['lambda']:.3f}"),
                     log_every=log_every, checkpoint_every=checkpoint_every,
                     checkpoint_fn=checkpoint_fn, progress=progress, probe=probe, probe_every=probe_every)
    with scope(model) as (d, model), amp_scope(resolve_amp_for(amp, model, device)):
        return _run_stage1(d, model, splits, config, loop, device=device, seed=seed, c0=c0,
                           eval_batch_size=eval_batch_size, resume_state=resume_state)


def _run_stage1(d: Dist, model, splits: Splits, config: Stage1Config, loop: StageLoop, *, device,
                seed: int, c0: Optional[float], eval_batch_size: int,
                resume_state: Optional[Dict[str, Any]]) -> StageResult:
    """The body of `stage1` inside its distributed and precision scopes."""
    params = require_trainable(model)
    model.eval()
    if resume_state is not None:
        c0 = float(resume_state["c0"])
    elif c0 is None:
        c0 = remote_loss_c0(model, splits.source("remote"), device, eval_batch_size)
    loop.extra["c0"] = c0
    master = MasterParams(params)
    opt = torch.optim.Adam(master.tensors, lr=config.lr, betas=tuple(config.adam_betas),
                           eps=config.adam_eps)
    al = _make_lagrangian(config, c0, state_dtype(params[0].dtype), device)
    remote = train_stream(splits, "remote", config.remote_batch_size, model, seed, "s1/remote", device)
    forget = train_stream(splits, "forget", config.forget_batch_size, model, seed, "s1/forget", device,
                     replay_first=config.forget_order == "cycle")
    objects = {"model": model, "optimizer": optimizer_entry(opt), "forget_stream": forget,
               "lagrangian": Reconfigured(al, lambda: setattr(al, "mu", config.mu))}
    if master.low:
        objects["master"] = master.tensors
    try:
        steps, history = loop.run(remote, config.epochs,
                                  _stage1_step(model, params, master, opt, al, forget, config, d),
                                  device=device, resume_state=resume_state, objects=objects,
                                  max_steps=config.max_steps)
    finally:
        remote.close()
        forget.close()
    return StageResult(stage=1, steps=steps, history=history, lam=al.lam.reshape(()), c0=c0,
                       lagrangian=al)
