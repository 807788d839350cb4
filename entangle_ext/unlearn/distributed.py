"""Runs on several processes (``torchrun``, `torch.distributed`): what is split, reduced and gathered
where, so that N ranks compute what one process computes with the same global batch
(docs/algorithm.md §11).

A run is distributed when `torch.distributed` is initialised with more than one rank. The model
decides how: a `torch.nn.parallel.DistributedDataParallel` wrapper or a plain module is
*replicated* (every rank holds all of θ; a plain module is first broadcast from rank 0, as DDP
does), a module sharded with ``torch.distributed.fsdp.fully_shard`` is *sharded* (each rank holds a
shard of every parameter, as DTensors). The conventions every stage and baseline follows:

* Data: each global minibatch (the batch one process would draw, same seed) is split into N
  contiguous parts, one per rank (`Dist.shard`); a part may be empty when the batch has fewer than
  N samples. Batch sizes in the configs are global.
* Losses: every rank computes the *global* objective (the same value on every rank) from its own
  samples through autograd-aware collectives: `Dist.means` (``all_reduce`` of sums and counts)
  and `Dist.gather` (``all_gather`` of per-sample values, e.g. the losses of the Wasserstein-2
  term). Their backward sums over the ranks, so a rank's gradient is N times its share.
* Gradients: averaged over the ranks, once per gradient (`GradSum`): replicated models take
  ``torch.autograd.grad`` on the unwrapped module (DDP's hooks never fire) and one all-reduce of
  the flattened gradient; sharded models take ``backward()`` with FSDP's gradient sync only on the
  last pass (FSDP reduce-scatters the average into each rank's shard).
* Everything else a rank holds (λ, c0, momentum, optimizer state, RNG, stream positions) is then
  identical on every rank (replicated) or the rank's shard of the single-process value (sharded).

Only rank 0 shows progress bars and writes reports and checkpoint files; sharded run objects
(FSDP parameters, optimizer state, momentum) are checkpointed with `torch.distributed.checkpoint`
by every rank (``entangle_ext/unlearn/sharded.py``).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .batch import concat_batches, require_graph
from .precision import state_dtype

__all__ = ["Dist", "SINGLE", "current", "scope", "unwrap", "GradSum", "init_from_env", "process_group_from_env",
           "check_world_size"]


@dataclass(frozen=True)
class Dist:
    """The process group a run uses: ``group`` (None = one process), ``rank``, ``world`` (N),
    ``kind`` ("single", "replicated" or "sharded"), ``device`` (where control tensors go), and
    ``fsdp``: the FSDP modules of a sharded model (their gradient sync is switched per pass)."""
    group: Any = None
    rank: int = 0
    world: int = 1
    kind: str = "single"
    device: torch.device = torch.device("cpu")
    fsdp: Tuple[Any, ...] = ()

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------ data
    def shard_sizes(self, n: int) -> List[int]:
        """Sizes of the N contiguous parts of a global batch of ``n`` samples (`torch.tensor_split`:
        the first n mod N ranks take one more)."""
        q, r = divmod(int(n), self.world)
        return [q + (i < r) for i in range(self.world)]

    def shard_span(self, n: int) -> Tuple[int, int]:
        """[lo, hi): this rank's positions within a global batch of ``n`` samples."""
        sizes = self.shard_sizes(n)
        lo = sum(sizes[:self.rank])
        return lo, lo + sizes[self.rank]

    def shard(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of the global index batch ``idx`` (``idx`` itself for one
        process); possibly empty."""
        if not self.active:
            return idx
        lo, hi = self.shard_span(idx.shape[0])
        return idx[lo:hi]

    # ------------------------------------------------------------------------------ reductions
    def means(self, *xs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Global means of per-sample values: for each 1-D ``x`` (this rank's samples), the mean over
        the samples of every rank, a 0-d tensor identical on every rank (one autograd-aware
        all-reduce for all of them). One process: ``x.mean()``."""
        if not self.active:
            return tuple(x.mean() for x in xs)
        dt = xs[0].dtype
        for x in xs[1:]:
            dt = torch.promote_types(dt, x.dtype)
        cnt = torch.tensor([float(x.numel()) for x in xs], dtype=dt).to(xs[0].device, non_blocking=True)
        vec = torch.cat([torch.stack([x.sum().to(dt) for x in xs]), cnt])
        tot = _autograd_collective("all_reduce", vec, group=self.group)
        k = len(xs)
        return tuple((tot[i] / tot[k + i]).to(x.dtype) for i, x in enumerate(xs))

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """In place: ``t`` ← Σ over the ranks (no autograd); returns ``t``."""
        if self.active:
            import torch.distributed as dist
            dist.all_reduce(t, group=self.group)
        return t

    def _layout(self, sizes: Sequence[int]) -> Tuple[List[List[int]], int]:
        """parts[k][r] = rank r's share of global batch k, and the longest per-rank total."""
        parts = [self.shard_sizes(n) for n in sizes]
        return parts, max(sum(p[r] for p in parts) for r in range(self.world))

    def longest(self, sizes: Sequence[int]) -> int:
        """The most samples any rank holds of the global batches of ``sizes`` (Σ sizes for one
        process): what every rank sizes its passes by, so that all take the same number."""
        return self._layout(sizes)[1]

    def concat(self, batches: List[Any]):
        """`concat_batches` of this rank's ``batches``, or None when they do not concatenate -
        on any rank for a sharded model, whose forward passes are collectives (every rank must
        take as many)."""
        cat = concat_batches(batches) if len(batches) > 1 else batches[0]
        if self.kind == "sharded" and self.any(cat is None):
            return None
        return cat

    def gather(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """All ranks' per-sample values in global order, differentiable.

        Args:
            x: (Σ_k n_k,) this rank's values of the global batches of ``sizes`` (its part of
                batch 1, then of batch 2, ...).
            sizes: the global batch sizes n_k (host ints, the same on every rank).
        Returns:
            (Σ sizes,) the values of batch 1 (rank 0's part, rank 1's, ...), then batch 2, ...:
            the order one process has. The backward (``torch.distributed.nn.functional.all_gather``)
            sums the incoming gradients over the ranks.
        """
        if not self.active:
            return x
        parts, longest = self._layout(sizes)
        padded = torch.nn.functional.pad(x, (0, longest - x.shape[0]))
        out = torch.cat(_autograd_collective("all_gather", padded, group=self.group))
        starts, idx = [0] * self.world, []
        for p in parts:
            for r, m in enumerate(p):
                idx.extend(range(r * longest + starts[r], r * longest + starts[r] + m))
                starts[r] += m
        return out[torch.tensor(idx, dtype=torch.long).to(x.device, non_blocking=True)]

    def local_part(self, xg: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Inverse of `gather` for this rank: its entries of the global-order vector ``xg``."""
        if not self.active:
            return xg
        idx, off = [], 0
        for n in sizes:
            lo, hi = self.shard_span(n)
            idx.extend(range(off + lo, off + hi))
            off += n
        return xg[torch.tensor(idx, dtype=torch.long).to(xg.device, non_blocking=True)]

    def any(self, flag: bool) -> bool:
        """True when ``flag`` is True on any rank (a collective: every rank must call it)."""
        if not self.active:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return bool(self.sum_(t).item() > 0)

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist
            dist.barrier(group=self.group)

    def broadcast_module_(self, model: torch.nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every rank's ``model`` (as DDP does at
        construction)."""
        if self.active:
            import torch.distributed as dist
            src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
            with torch.no_grad():
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, src=src, group=self.group)

    def average_grads_(self, params: Sequence[torch.Tensor]) -> None:
        """After ``loss.backward()`` on a replicated model: each ``.grad`` ← its mean over the
        ranks (one all-reduce). Sharded models: nothing (FSDP reduced them in the backward)."""
        if self.active and self.kind == "replicated":
            average_(self, [p.grad for p in params if p.grad is not None])

    def grads(self, params: Sequence[torch.Tensor], keep_none: bool = False) -> "GradSum":
        """A `GradSum` over ``params`` for this run."""
        return GradSum(self, params, keep_none)


def _autograd_collective(name: str, *args, **kw):
    """``torch.distributed.nn.functional.<name>`` (differentiable: its backward sums the incoming
    gradients over the ranks), without its deprecation warning at every call."""
    import torch.distributed.nn.functional as dnn
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional", category=FutureWarning)
        return getattr(dnn, name)(*args, **kw)


SINGLE = Dist()
_CURRENT: contextvars.ContextVar[Dist] = contextvars.ContextVar("entangle_dist", default=SINGLE)


def current() -> Dist:
    """The `Dist` of the run in progress (`SINGLE` outside a `scope`)."""
    return _CURRENT.get()


class GradSum:
    """Σ over backward passes of ∇ losses with respect to ``params``, kept on each rank, then
    averaged over the ranks once (`result`). One process: ``torch.autograd.grad`` summed in the
    parameters' state dtype (float32 at least), as the stages always did."""

    def __init__(self, d: Dist, params: Sequence[torch.Tensor], keep_none: bool = False):
        self.d, self.params, self.keep_none = d, list(params), keep_none
        self.acc: Optional[List[Optional[torch.Tensor]]] = None
        self._owned = False   # acc is our own buffer (else autograd's first result)

    def add(self, loss: torch.Tensor, last: bool = True) -> None:
        """Accumulate ∇ ``loss``; ``last`` marks the final pass (FSDP syncs its gradients then).
        ValueError for a ``loss`` without an autograd graph (`require_graph`)."""
        require_graph(loss)
        if self.d.kind == "sharded":
            for m in self.d.fsdp:
                m.set_requires_gradient_sync(last, recurse=False)
            loss.backward()
            return
        gs = list(torch.autograd.grad(loss, self.params, allow_unused=True))
        if self.acc is None:
            self.acc = gs
            return
        if not self._owned:
            self.acc = [None if g is None else g.to(state_dtype(g.dtype), copy=True) for g in self.acc]
            self._owned = True
        for i, g in enumerate(gs):
            if g is not None:
                self.acc[i] = g.to(state_dtype(g.dtype), copy=True) if self.acc[i] is None \
                    else self.acc[i].add_(g)

    def result(self) -> List[Optional[torch.Tensor]]:
        """The gradients averaged over the ranks (sharded: each rank's shard, as DTensors; the
        ``.grad`` of sharded parameters is cleared). Parameters no loss reached: zeros, or None
        with ``keep_none`` (an optimizer then skips them)."""
        if self.d.kind == "sharded":
            out = [p.grad for p in self.params]
            for p in self.params:
                p.grad = None
        else:
            if self.acc is None:
                raise ValueError("GradSum.result() before any add()")
            out = self.acc
            if self.d.active:
                average_(self.d, [g for g in out if g is not None])
        if self.keep_none:
            return out
        return [torch.zeros_like(p) if g is None else g for g, p in zip(out, self.params)]


def average_(d: Dist, tensors: List[torch.Tensor]) -> None:
    """In place: each tensor ← its mean over the ranks, with one all-reduce of the flattened list
    (grouped by dtype)."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    by_dtype: Dict[torch.dtype, List[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for ids in by_dtype.values():
        ts = [tensors[i] for i in ids]
        flat = d.sum_(_flatten_dense_tensors(ts)).div_(d.world)
        with torch.no_grad():
            for t, f in zip(ts, _unflatten_dense_tensors(flat, ts)):
                t.copy_(f)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module a DDP wrapper holds (the model itself otherwise)."""
    from torch.nn.parallel import DistributedDataParallel
    return model.module if isinstance(model, DistributedDataParallel) else model


def _detect(model: torch.nn.Module) -> Dist:
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    from torch.nn.parallel import DistributedDataParallel
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        from torch.distributed.fsdp import FSDPModule
        fsdp = tuple(m for m in model.modules() if isinstance(m, FSDPModule))
    except ImportError:
        fsdp = ()
    if fsdp:
        p = next(p for p in model.parameters())
        group = p.device_mesh.get_group() if hasattr(p, "device_mesh") else dist.group.WORLD
        kind = "sharded"
    else:
        group = model.process_group if isinstance(model, DistributedDataParallel) else None
        kind = "replicated"
    world = dist.get_world_size(group)
    if world == 1:
        return SINGLE
    return Dist(group=group, rank=dist.get_rank(group), world=world, kind=kind, device=dev, fsdp=fsdp)


@contextlib.contextmanager
def scope(model: torch.nn.Module) -> Iterator[Tuple[Dist, torch.nn.Module]]:
    """Context manager of one run: yields (the `Dist` of ``model``, the module to call).

    Inside an active scope (e.g. a stage called by `unlearn`) the same `Dist` is reused. Outside,
    the run is distributed when `torch.distributed` is initialised with more than one rank: a
    DDP-wrapped model is unwrapped (its module is called directly, so DDP's gradient hooks never
    run), a plain module is broadcast from rank 0, an FSDP (``fully_shard``) model is used as it is.
    """
    inner = unwrap(model)
    d = current()
    if d is not SINGLE:
        yield d, inner
        return
    d = _detect(model)
    if d.kind == "replicated" and model is inner:
        d.broadcast_module_(inner)
    token = _CURRENT.set(d)
    try:
        yield d, inner
    finally:
        _CURRENT.reset(token)


def check_world_size(ckpt: Dict[str, Any], d: Optional[Dist] = None) -> None:
    """ValueError when the checkpoint ``ckpt`` was written by a run on another number of ranks."""
    d = d or current()
    old = int(ckpt.get("world_size", 1))
    if old != d.world:
        raise ValueError(f"resume: the checkpoint was written by a run on {old} process(es), this run "
                         f"has {d.world}: the data shards, optimizer shards and RNG states belong to "
                         f"{old} ranks. Resume with the same number of processes (torchrun "
                         f"--nnodes/--nproc_per_node giving {old} in all) or restart the run")


def init_from_env(device=None) -> Tuple[Dist, torch.device]:
    """Initialise the default process group from ``torchrun``'s environment (WORLD_SIZE > 1;
    NCCL with one GPU per local rank when ``device`` is CUDA, else gloo) and return (its `Dist`
    before a model is known, the device of this rank). One process: (`SINGLE`, ``device``)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return SINGLE, dev
    import torch.distributed as dist
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), kind="replicated", device=dev), dev


@contextlib.contextmanager
def process_group_from_env(device=None):
    """`init_from_env` as a context: yields (`Dist`, device) and, when it created the default
    process group, destroys it on the way out, so a rank does not exit with a live group (gloo's
    threads torn down at interpreter exit can abort the process: "terminate called without an
    active exception", SIGABRT instead of the run's own exit code). After a normal exit all ranks
    meet at a barrier first. After an error only a gloo group is destroyed (that is local to the
    rank); an NCCL group is left to the process exit, as its shutdown waits for collectives that
    the other ranks may never join."""
    import torch.distributed as dist
    created = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not (dist.is_available() and dist.is_initialized())
    d, dev = init_from_env(device)
    ok = False
    try:
        yield d, dev
        ok = True
    finally:
        if created and dist.is_initialized():
            if ok:
                dist.barrier()
                dist.destroy_process_group()
            elif dist.get_backend() == "gloo":
                dist.destroy_process_group()
