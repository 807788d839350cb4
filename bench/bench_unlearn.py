"""Stage-1 and Stage-2 step time: the driver (entangle_ext.stage1 / stage2) vs the naive
transcription of the reference recipe (entangle_ext/reference/unlearn.py), same model, data,
settings and run; then (CPU, unless --skip-end-to-end) the whole `entangle_ext.unlearn` call on
the cifar100/cpu setting with its preset against the naive float32 transcription on the same
splits (bench/_end_to_end.py), whose ratio is the last line printed:
``end-to-end speedup vs naive: <float>x``. ``--basis-every R [R ...]`` also times the unlearn
call with ``stage2.basis_every = R`` (ours: it changes the algorithm) against the same naive run,
each printed as its own row before that line; ``--contiguous-row`` and ``--compile-row`` add the
preset with ``channels_last=False`` and the preset on a ``model.compile()``'d original model.

ResNet-18 (CIFAR stem, 20 classes, 11.2 M parameters) at CIFAR shapes (3×32×32) on random inputs.
Defaults: paper batch sizes on CUDA (Stage 1 remote 128 / forget 16; Stage 2 adjacent 128, forget
128×10, remote 512×10); on CPU small ones (see --help) so that it finishes in a few minutes.

One step's time is (T(1 + n steps) − T(1 step)) / n for each of the two, so that what a call does
once (the driver's ℓ(θ̄) of the forget set, streams, the naive's model copy) is not counted; the
calls run in interleaved rounds (naive, driver, naive, driver, ...), and the table gives the
median per-step time and the spread over the rounds. The ratio naive / driver is printed against
its target (Stage 2: >= 1.0 on CPU, >= 3 on CUDA; Stage 1: none). The JSON file is rewritten after
every round, so a run stopped by --time-budget (or killed) keeps what it measured.

    python bench/bench_unlearn.py --device cuda --json bench_unlearn.json --time-budget 20
    OMP_WAIT_POLICY=PASSIVE python bench/bench_unlearn.py --device cpu --json bench/results/unlearn_cpu.json
    python bench/bench_unlearn.py --device cpu --skip-steps --cache-dir runs/bench   # end to end only
    python bench/bench_unlearn.py --device cpu --skip-steps --cache-dir runs/bench --basis-every 2
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, save_json  # noqa: E402
import _end_to_end  # noqa: E402

import entangle_ext as ee  # noqa: E402
from entangle_ext.data.cifar100 import resnet18_cifar  # noqa: E402
from entangle_ext.reference.unlearn import (driver_order_stage1, driver_order_stage2,  # noqa: E402
                                            naive_stage1, naive_stage2)
from entangle_ext.unlearn.losses import auto_micro_batch  # noqa: E402

#: naive / driver per-step time the Stage-2 step must reach (no target for Stage 1)
STAGE2_TARGET = {"cpu": 1.0, "cuda": 3.0}


def _timed(fn, dev) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def _take(ds: TensorDataset, n: int) -> TensorDataset:
    return TensorDataset(*[t[:n] for t in ds.tensors])


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return n


def _micro_batch(text: str):
    """--micro-batch: "auto", "none" (one pass) or a number of samples."""
    word = text.strip().lower()
    return {"auto": "auto", "none": None}[word] if word in ("auto", "none") else int(word)


def stage1_runs(base, splits, s1, dev):
    """{name: fn(k)} running k Stage-1 steps from a fresh copy of ``base`` (the copy untimed)."""
    c0 = 3.0
    remote, forget = driver_order_stage1(splits, s1, seed=0, device=dev)

    def naive(k):
        m = copy.deepcopy(base)
        return _timed(lambda: naive_stage1(m, remote[:k], forget, lr=s1.lr, c0=c0), dev)

    def driver(k):
        m = copy.deepcopy(base)
        sp = dataclasses.replace(splits, remote=_take(splits.remote, s1.remote_batch_size * k))
        return _timed(lambda: ee.stage1(m, sp, s1, c0=c0, progress=False, log_every=10 ** 9), dev)
    return {"naive": naive, "driver": driver}


def stage2_runs(base, splits, s2, dev):
    """{name: fn(k)} running k Stage-2 steps from a fresh copy of ``base`` (the copy untimed)."""
    sched = driver_order_stage2(splits, s2, seed=0, device=dev)

    def naive(k):
        m = copy.deepcopy(base)
        return _timed(lambda: naive_stage2(m, sched[:k], lr=s2.lr), dev)

    def driver(k):
        m = copy.deepcopy(base)
        sp = dataclasses.replace(splits, adjacent=_take(splits.adjacent, s2.adjacent_batch_size * k))
        return _timed(lambda: ee.stage2(m, sp, s2, progress=False, log_every=10 ** 9), dev)
    return {"naive": naive, "driver": driver}


def measure(name, runs, steps, rounds, deadline, res, save):
    """Interleaved rounds of T(1) and T(1 + steps) for each run; per-step times into res[name]."""
    for fn in runs.values():   # warm-up (allocator, oneDNN / cuDNN plans)
        fn(1)
    out = res[name]
    per = {k: [] for k in runs}
    for r in range(rounds):
        if r > 0 and time.perf_counter() > deadline:
            out["stopped_by_time_budget"] = True
            break
        for k, fn in runs.items():
            t1, tn = fn(1), fn(1 + steps)
            per[k].append((tn - t1) / steps)
        med = {k: statistics.median(v) for k, v in per.items()}
        out.update(rounds=len(per["naive"]), naive_ms=1e3 * med["naive"],
                   driver_ms=1e3 * med["driver"], speedup=med["naive"] / med["driver"],
                   naive_ms_all=[1e3 * t for t in per["naive"]],
                   driver_ms_all=[1e3 * t for t in per["driver"]])
        save()
    return out


def print_row(name, out, target):
    spread = {k: 100 * (max(v) - min(v)) / statistics.median(v) for k, v in
              (("naive", out["naive_ms_all"]), ("driver", out["driver_ms_all"]))}
    verdict = "" if target is None else \
        f"target >= {target:g}x " + ("ok" if out["speedup"] >= target else "BELOW")
    print(f"{name} step: naive {out['naive_ms']:9.1f} ms ±{spread['naive']:3.0f}% | driver "
          f"{out['driver_ms']:9.1f} ms ±{spread['driver']:3.0f}% | x{out['speedup']:.2f} {verdict} "
          f"({out['rounds']} rounds; ± = (max-min)/median)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=None, help="n: timed steps per call (cpu 2, cuda 5)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per stage (cpu 3, cuda 5)")
    ap.add_argument("--batch-limit", type=int, default=None,
                    help="Stage 2 forget/remote limit (cpu 2, cuda 10)")
    ap.add_argument("--scale", type=float, default=None, help="batch-size scale vs paper (cpu 0.125, cuda 1)")
    ap.add_argument("--micro-batch", type=_micro_batch, default="auto",
                    help="Stage 2 micro_batch of the driver: auto (default), none or a number")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds: start no round after this (each stage gets at least one)")
    ap.add_argument("--json", default=None, help="write the results here, updated after every round")
    e2e = ap.add_argument_group("end to end (cifar100/cpu; needs cifar100.npz)")
    e2e.add_argument("--skip-steps", action="store_true", help="only the end-to-end comparison")
    e2e.add_argument("--skip-end-to-end", action="store_true", help="only the step times (default on cuda)")
    e2e.add_argument("--seed", type=int, default=0, help="data selection, original model and run seed")
    e2e.add_argument("--cache-dir", default=None, help="cache of the original model (else it is trained each time)")
    e2e.add_argument("--data-root", default=None, help="cifar100.npz or its directory (default: the data dirs)")
    e2e.add_argument("--amp", choices=["preset", "none", "bf16"], default="preset",
                     help="amp of the unlearn call (default: the preset's)")
    e2e.add_argument("--basis-every", type=_positive_int, nargs="+", default=None, metavar="R",
                     help="also time unlearn with stage2.basis_every=R (ours: another algorithm), each as "
                          "its own row against the same naive run; the last line stays the preset's")
    e2e.add_argument("--contiguous-row", action="store_true",
                     help="also time unlearn with channels_last=False (the preset otherwise; contiguous "
                          "image batches as before that field), its own row against the same naive run")
    e2e.add_argument("--compile-row", action="store_true",
                     help="also time unlearn (the preset) on the original model compiled in place with "
                          "model.compile() (torch.compile, inductor), compilation included, its own row")
    e2e.add_argument("--caps", type=int, default=None,
                     help="quick check: at most N train/test images per fine class, 1-epoch original model")
    args = ap.parse_args(argv)
    args.amp = None if args.amp == "none" else args.amp
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but no CUDA device is available")
    cpu = dev.type == "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (2 if cpu else 5)
    rounds = args.rounds or (3 if cpu else 5)
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
    splits = ee.Splits(forget=ds(s2.forget_batch_size * limit),
                       adjacent=ds(s2.adjacent_batch_size * (steps + 1)),
                       remote=ds(max(s1.remote_batch_size * (steps + 1),
                                     s2.remote_batch_size * limit)))
    torch.manual_seed(0)
    base = resnet18_cifar(20).to(dev).eval()
    probe = tuple(t[:1] for t in splits.forget.tensors)
    resolved = auto_micro_batch(base, probe) if s2.micro_batch == "auto" else s2.micro_batch
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    res = {"benchmark": "unlearn_step", **environment(dev), "load_average_1min": load,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "params": sum(p.numel() for p in base.parameters()), "steps_per_call": steps,
           "stage1": {"remote_batch": s1.remote_batch_size, "forget_batch": s1.forget_batch_size,
                      "target": None},
           "stage2": {"adjacent_batch": s2.adjacent_batch_size, "forget": [s2.forget_batch_size, limit],
                      "remote": [s2.remote_batch_size, limit], "micro_batch": s2.micro_batch,
                      "micro_batch_resolved": resolved, "target": STAGE2_TARGET[dev.type]},
           "ops_native": {n: hasattr(ee, n) for n in ("project_orthogonal_", "dual_update_",
                                                      "augmented_lagrangian_term")}}
    if not args.skip_steps:
        print(f"# ResNet-18 CIFAR, {res['device_name']}, {res['threads']} threads, torch "
              f"{torch.__version__}, load average {load}, OMP_WAIT_POLICY={res['omp_wait_policy']}; "
              f"Stage 2: adjacent {s2.adjacent_batch_size}, forget {s2.forget_batch_size}x{limit}, remote "
              f"{s2.remote_batch_size}x{limit}, micro_batch {s2.micro_batch!r} -> {resolved}", flush=True)
    save = lambda: save_json(args.json, res, quiet=True)  # noqa: E731
    if not args.skip_steps:
        step_times(base, splits, s1, s2, dev, steps, rounds, args.time_budget, res, save)
    if not (args.skip_end_to_end or dev.type == "cuda"):
        speedup = _end_to_end.run(args, res, save)
        if args.json:
            print(f"saved {args.json}")
        print(f"end-to-end speedup vs naive: {speedup:.2f}x")
    elif args.json:
        print(f"saved {args.json}")
    return res


def step_times(base, splits, s1, s2, dev, steps, rounds, budget, res, save) -> None:
    """The per-step rows of Stage 1 and Stage 2 (40 % / 100 % of ``budget`` seconds)."""
    start = time.perf_counter()
    d1 = float("inf") if budget is None else start + 0.4 * budget   # Stage 1: 40 % of the budget
    print_row("stage 1", measure("stage1", stage1_runs(base, splits, s1, dev), steps, rounds, d1,
                                 res, save), None)
    d2 = float("inf") if budget is None else start + budget
    print_row("stage 2", measure("stage2", stage2_runs(base, splits, s2, dev), steps, rounds, d2,
                                 res, save), STAGE2_TARGET[dev.type])


if __name__ == "__main__":
    main()
