"""Stage-1 and Stage-2 step time: the driver (entangle_ext.stage1 / stage2) vs the naive
transcription of the reference recipe (entangle_ext/reference/unlearn.py), same model, data,
settings and run.

ResNet-18 (CIFAR stem, 20 classes, 11.2 M parameters) at CIFAR shapes (3×32×32) on random inputs.
Defaults: paper batch sizes on CUDA (Stage 1 remote 128 / forget 16; Stage 2 adjacent 128, forget
128×10, remote 512×10); on CPU small ones (see --help) so that it finishes in a few minutes.

    python bench/bench_unlearn.py --device cuda --json bench_unlearn.json
    python bench/bench_unlearn.py --device cpu --steps 2
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.data.cifar100 import resnet18_cifar
from entangle_ext.reference.unlearn import (driver_order_stage1, driver_order_stage2, naive_stage1,
                                            naive_stage2)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev):
    _sync(dev)
    t = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=None, help="timed steps per stage (cpu 2, cuda 10)")
    ap.add_argument("--batch-limit", type=int, default=None, help="Stage 2 forget/remote limit (cpu 2, cuda 10)")
    ap.add_argument("--scale", type=float, default=None, help="batch-size scale vs paper (cpu 0.125, cuda 1)")
    ap.add_argument("--micro-batch", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", nargs="?", const="-", default=None, help="write JSON (to a file, or '-' = stdout)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    cpu = dev.type == "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (2 if cpu else 10)
    limit = args.batch_limit or (2 if cpu else 10)
    sc = args.scale or (0.125 if cpu else 1.0)
    bs = lambda n: max(2, int(round(n * sc)))  # noqa: E731
    s1 = ee.Stage1Config(lr=2.5e-6, remote_batch_size=bs(128), forget_batch_size=bs(16))
    s2 = ee.Stage2Config(alpha=0.5, lr=2e-5, momentum=0.9, epochs=1, adjacent_batch_size=bs(128),
                         forget_batch_size=bs(128), forget_batch_limit=limit, remote_batch_size=bs(512),
                         remote_batch_limit=limit, micro_batch=args.micro_batch)
    g = torch.Generator().manual_seed(0)

    def ds(n):
        return TensorDataset(torch.randn(n, 3, 32, 32, generator=g).to(dev),
                             torch.randint(0, 20, (n,), generator=g).to(dev))
    # +1 step of warm-up in each stage
    splits = ee.Splits(forget=ds(s2.forget_batch_size * limit),
                       adjacent=ds(s2.adjacent_batch_size * (steps + 1)),
                       remote=ds(max(s1.remote_batch_size * (steps + 1), s2.remote_batch_size * limit)))
    torch.manual_seed(0)
    base = resnet18_cifar(20).to(dev).eval()
    n_params = sum(p.numel() for p in base.parameters())
    res = {"device": str(dev), "device_name": torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor(),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "params": n_params, "steps": steps,
           "stage1": {"remote_batch": s1.remote_batch_size, "forget_batch": s1.forget_batch_size},
           "stage2": {"adjacent_batch": s2.adjacent_batch_size, "forget": [s2.forget_batch_size, limit],
                      "remote": [s2.remote_batch_size, limit], "micro_batch": args.micro_batch}}

    # Stage 1: steps+1 steps over the remote set; the first is warm-up (timed separately)
    c0 = 3.0
    remote, forget = driver_order_stage1(splits, s1, seed=0, device=dev)
    m = copy.deepcopy(base)
    t_naive = _timed(lambda: naive_stage1(m, remote[:1], forget, lr=s1.lr, c0=c0), dev)
    t_naive = _timed(lambda: naive_stage1(m, remote[1:steps + 1], forget, lr=s1.lr, c0=c0), dev) / steps
    m = copy.deepcopy(base)
    sp1 = ee.Splits(forget=splits.forget, adjacent=splits.adjacent,
                    remote=TensorDataset(*[t[:s1.remote_batch_size] for t in splits.remote.tensors]))
    _timed(lambda: ee.stage1(m, sp1, s1, c0=c0, progress=False, log_every=10 ** 9), dev)
    spn = ee.Splits(forget=splits.forget, adjacent=splits.adjacent,
                    remote=TensorDataset(*[t[:s1.remote_batch_size * steps] for t in splits.remote.tensors]))
    t_drv = _timed(lambda: ee.stage1(m, spn, s1, c0=c0, progress=False, log_every=10 ** 9), dev) / steps
    res["stage1"].update(naive_ms=1e3 * t_naive, driver_ms=1e3 * t_drv, speedup=t_naive / t_drv)
    print(f"stage 1 step: naive {1e3 * t_naive:8.1f} ms | driver {1e3 * t_drv:8.1f} ms | x{t_naive / t_drv:.2f}",
          file=sys.stderr)

    # Stage 2
    sched = driver_order_stage2(splits, s2, seed=0, device=dev)
    m = copy.deepcopy(base)
    _timed(lambda: naive_stage2(m, sched[:1], lr=s2.lr), dev)
    t_naive = _timed(lambda: naive_stage2(m, sched[1:steps + 1], lr=s2.lr), dev) / steps
    m = copy.deepcopy(base)
    sp1 = ee.Splits(forget=splits.forget, remote=splits.remote,
                    adjacent=TensorDataset(*[t[:s2.adjacent_batch_size] for t in splits.adjacent.tensors]))
    _timed(lambda: ee.stage2(m, sp1, s2, progress=False, log_every=10 ** 9), dev)
    spn = ee.Splits(forget=splits.forget, remote=splits.remote,
                    adjacent=TensorDataset(*[t[:s2.adjacent_batch_size * steps] for t in splits.adjacent.tensors]))
    t_drv = _timed(lambda: ee.stage2(m, spn, s2, progress=False, log_every=10 ** 9), dev) / steps
    res["stage2"].update(naive_ms=1e3 * t_naive, driver_ms=1e3 * t_drv, speedup=t_naive / t_drv)
    print(f"stage 2 step: naive {1e3 * t_naive:8.1f} ms | driver {1e3 * t_drv:8.1f} ms | x{t_naive / t_drv:.2f}",
          file=sys.stderr)
    res["ops_native"] = {n: hasattr(ee, n) for n in ("project_orthogonal_", "dual_update_",
                                                     "augmented_lagrangian_term")}
    if args.json == "-":
        print(json.dumps(res, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
