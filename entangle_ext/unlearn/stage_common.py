"""What both stages read besides their own steps (``entangle_ext/unlearn/stages.py``): the seeded
training streams of a split (`train_stream`), c0 = the remote loss at entry (`remote_loss_c0`,
Stage 1's constraint target) and b = −ℓ(θ̄), the per-sample reference losses of the forget set
at Stage-2 entry (`reference_losses`, the Wasserstein-2 term's reference profile)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from .data import BatchStream, Splits, has_batchnorm
from .distributed import current, scope
from .losses import per_sample_ce
from .precision import model_dtype

__all__ = ["train_stream", "remote_loss_c0", "reference_losses", "CheckpointFn"]

CheckpointFn = Callable[[int, Dict[str, Any]], Optional[str]]
"""``checkpoint_fn(step, objects)`` of a stage: writes a checkpoint, returns its path (or None)."""


def train_stream(splits: Splits, name: str, batch_size: int, model, seed: int, stream: str, device,
                 **kw) -> BatchStream:
    """The shuffled, seeded, resumable `BatchStream` of split ``name`` that a stage trains on:
    batches of ``batch_size`` in the model's floating dtype on ``device``, named ``stream`` in
    checkpoints (e.g. "s1/remote"); a 1-sample last batch is folded into the previous one when the
    model has BatchNorm. ``kw``: more `BatchStream` arguments."""
    return BatchStream(splits.source(name), batch_size, shuffle=True, seed=seed, name=stream,
                       device=device, input_dtype=model_dtype(model), training=True,
                       fold_tail=has_batchnorm(model), **kw)


@torch.no_grad()
def remote_loss_c0(model: torch.nn.Module, dataset, device, batch_size: int = 512) -> float:
    """c0 = mean CE (nats) of ``model`` over the whole dataset (docs/algorithm.md §2), no grad,
    accumulated in float64 (per-sample losses in the logits' dtype, float32 at least); under
    several ranks each takes its part of every batch and the sums are all-reduced.

    One host read at the end. Raises ValueError for an empty dataset or non 2-D logits.
    """
    with scope(model) as (d, model):
        s = BatchStream(dataset, batch_size, shuffle=False, seed=0, name="c0/remote", device=device,
                        input_dtype=model_dtype(model))
        if s.n == 0:
            raise ValueError("remote split is empty")
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=device)
        for b in s.epoch_batches(0):
            total += per_sample_ce(model, b).double().sum()
        return float(d.sum_(total)) / s.n


@torch.no_grad()
def reference_losses(model: torch.nn.Module, dataset, device, batch_size: int = 512) -> torch.Tensor:
    """b = −ℓ(θ̄): minus the per-sample CE (nats) of ``model`` (θ̄, the model at Stage-2 entry) on
    every sample of ``dataset``, shape (N,), in dataset order, in the losses' dtype, on ``device``
    (docs/algorithm.md §3, step 2: the reference profile of the Wasserstein-2 term; computed once
    instead of one forward pass of a frozen copy per forget batch). Under several ranks each
    evaluates its part and every rank receives all N values."""
    d = current()
    s = BatchStream(dataset, batch_size, shuffle=False, seed=0, name="ref/forget", device=device,
                    input_dtype=model_dtype(model))
    model.eval()
    local = torch.cat([-per_sample_ce(model, b) for b in s.epoch_batches(0)])
    return d.gather(local, [len(i) for i in s.global_batch_indices(0)])
