"""Communication per Stage-2 step under N ranks (gloo, CPU): what `entangle_ext.stage2` sends, counted
by wrapping the `torch.distributed` collectives, against a plain flatten-and-all-reduce of the three
full gradients (g_adj, g_f, g_rem) that an unsharded projection on every rank would need.

Replicated (DDP) runs all-reduce each full gradient once (one flattened buffer each); sharded (FSDP,
``fully_shard``) runs reduce-scatter each gradient into the ranks' shards and join the projection
with one all-reduce of k·k + k float64 numbers (VVᵀ and Vv, k = 2). Per step = (bytes of a run
with 2E steps − bytes of one with E steps) / E, so setup (θ̄'s reference losses, evaluation) cancels.

Bytes are the sizes of the tensors handed to each collective (payload, per rank) and the ring
algorithm's traffic sent per rank: all-reduce 2(N−1)/N·B, reduce-scatter and all-gather
(N−1)/N·B (B = the unsharded buffer), broadcast B, all-to-all (N−1)/N·B, scatter the part received.
FSDP's all-gathers of parameter shards (every forward, and again in the backward) are reported
apart: any FSDP training has them.

    python bench/bench_distributed.py                      # 2 ranks, MLP of ~0.5 M parameters
    python bench/bench_distributed.py --world 4 --width 1024 --json bench/results/distributed_cpu.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from collections import defaultdict
from datetime import timedelta

import torch
from torch.utils.data import TensorDataset

_RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0, "scatter": lambda n: 1.0}
#: FSDP's all-gathers of parameter shards (every forward; any FSDP training has them).
PARAM_GATHERS = ("all_gather_single", "all_gather_into_tensor")


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        t = x.to_local() if hasattr(x, "to_local") else x
        return t.numel() * t.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


class Counter:
    """Wraps the torch.distributed collectives: per-name payload bytes (the unsharded buffer:
    all-reduce/broadcast input, reduce-scatter input, all-gather output) and call counts."""

    def __init__(self):
        self.bytes, self.calls = defaultdict(int), defaultdict(int)

    def install(self):
        import inspect

        import torch.distributed as dist
        which = {"all_reduce": 0, "broadcast": 0, "reduce_scatter_tensor": 1, "reduce_scatter_single": 1,
                 "all_gather_into_tensor": 0, "all_gather_single": 0, "all_gather": 0, "all_to_all": 0,
                 "scatter": 0}   # gloo runs all_gather's backward (all-to-all) as scatters
        for name, arg in which.items():
            real = getattr(dist, name)
            param = list(inspect.signature(real).parameters)[arg]   # the unsharded buffer's argument

            def wrapped(*a, _real=real, _name=name, _param=param, **k):
                bound = inspect.signature(_real).bind(*a, **k)
                self.bytes[_name] += _nbytes(bound.arguments[_param])
                self.calls[_name] += 1
                return _real(*a, **k)
            setattr(dist, name, wrapped)

    def snapshot(self):
        return dict(self.bytes), dict(self.calls)


def _problem(width: int, dim: int = 64, classes: int = 10, n: int = 96):
    g = torch.Generator().manual_seed(0)

    def part(m, label=None):
        y = torch.randint(0, classes, (m,), generator=g) if label is None else torch.full((m,), label)
        return TensorDataset(torch.randn(m, dim, generator=g), y)
    import entangle_ext as ee
    splits = ee.Splits(forget=part(n // 2, 1), adjacent=part(n), remote=part(n))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(dim, width), torch.nn.Tanh(), torch.nn.Linear(width, width),
                                torch.nn.Tanh(), torch.nn.Linear(width, classes))
    return splits, model


def _stage2_bytes(kind: str, world: int, width: int, epochs: int, counter: Counter):
    import entangle_ext as ee
    splits, model = _problem(width)
    if kind == "sharded":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    cfg = ee.Stage2Config(epochs=epochs, adjacent_batch_size=32, forget_batch_size=16, forget_batch_limit=2,
                          remote_batch_size=32, remote_batch_limit=2, lr=1e-3)
    before = counter.snapshot()
    r = ee.stage2(model, splits, cfg, progress=False, log_every=1000)
    after = counter.snapshot()
    nparams = sum(p.numel() for p in model.parameters())
    diff = {k: after[0].get(k, 0) - before[0].get(k, 0) for k in after[0]}
    calls = {k: after[1].get(k, 0) - before[1].get(k, 0) for k in after[1]}
    return r.steps, diff, calls, nparams


def _plain_bytes(nparams: int, counter: Counter) -> int:
    """A plain flatten-and-all-reduce of the three full float32 gradients (measured)."""
    import torch.distributed as dist
    before = counter.snapshot()[0].get("all_reduce", 0)
    for _ in range(3):
        dist.all_reduce(torch.zeros(nparams))
    return counter.snapshot()[0]["all_reduce"] - before


def _worker(rank: int, world: int, init: str, width: int, out: str):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    counter = Counter()
    counter.install()
    rows = []
    for kind in ("replicated", "sharded"):
        s1, b1, c1, nparams = _stage2_bytes(kind, world, width, 1, counter)
        s2, b2, c2, _ = _stage2_bytes(kind, world, width, 2, counter)
        per = {k: (b2.get(k, 0) - b1.get(k, 0)) / (s2 - s1) for k in set(b1) | set(b2)}
        calls = {k: (c2.get(k, 0) - c1.get(k, 0)) / (s2 - s1) for k in set(c1) | set(c2)}
        plain = _plain_bytes(nparams, counter)
        step = {k: v for k, v in per.items() if k not in PARAM_GATHERS}
        rows.append({"kind": kind, "params": nparams, "payload_bytes": per, "calls": calls,
                     "ring_bytes": sum(_RING.get(k, lambda n: (n - 1) / n)(world) * v for k, v in step.items()),
                     "param_gather_bytes": sum(v for k, v in per.items() if k in PARAM_GATHERS),
                     "plain_payload_bytes": plain, "plain_ring_bytes": _RING["all_reduce"](world) * plain})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2, help="processes (gloo, CPU)")
    ap.add_argument("--width", type=int, default=640, help="hidden width of the 3-layer MLP")
    ap.add_argument("--json", default=None, help="write the rows as JSON to this file")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(_worker, args=(args.world, os.path.join(tmp, "init"), args.width, out), nprocs=args.world)
        rows = json.load(open(out))
    print(f"Stage-2 communication per step, {args.world} ranks (gloo), bytes per rank")
    print(f"{'model':<11} {'params':>9} {'ring sent':>12} {'plain':>12} {'ratio':>7} {'param gathers':>14}  collectives")
    for r in rows:
        kinds = ", ".join(f"{k} {v / 1e3:.1f} kB x{r['calls'][k]:.0f}" for k, v in sorted(r["payload_bytes"].items()) if v)
        print(f"{r['kind']:<11} {r['params']:>9} {r['ring_bytes']:>12.0f} {r['plain_ring_bytes']:>12.0f} "
              f"{r['ring_bytes'] / r['plain_ring_bytes']:>7.3f} {r['param_gather_bytes']:>14.0f}  {kinds}")
    print("ring sent: gradient, loss and projection collectives (FSDP's parameter all-gathers apart); plain = a "
          "ring all-reduce of the flattened g_adj, g_f, g_rem (3·P float32) every step; ratio = ring sent / plain")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": args.world, "width": args.width, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
