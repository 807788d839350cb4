"""Shared timing helpers of the benchmarks (median wall time, CUDA events on GPU)."""
from __future__ import annotations

import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch


def time_fn(fn, device: torch.device, *, warmup: int = 3, reps: int = 20, min_time: float = 0.2) -> float:
    """Median time of fn() in milliseconds (CUDA: events on the current stream, after warm-up)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start_all = time.perf_counter()
        while len(times) < reps or (time.perf_counter() - start_all < min_time and len(times) < 10 * reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    else:
        start_all = time.perf_counter()
        while len(times) < reps or (time.perf_counter() - start_all < min_time and len(times) < 10 * reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def environment(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {
        "device": str(device), "device_name": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "threads": torch.get_num_threads(),
    }


def save_json(path: str | None, payload: dict, quiet: bool = False) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2))
    if not quiet:
        print(f"saved {p}")


def time_interleaved(fns: dict, device: torch.device, *, warmup: int = 2, reps: int = 15,
                     min_time: float = 0.0, max_reps: int = 200,
                     budget_s: float | None = None) -> dict:
    """Times several callables in alternation, one call of each per round, so that a change of
    machine load hits them alike; each round starts one further along (A B C, B C A, C A B, ...),
    so that no callable always runs right after the same one (whose data would leave the caches
    warm or cold for it). Runs at least ``reps`` rounds and until ``min_time`` seconds have
    passed (at most ``max_reps``); with ``budget_s``, stops early once that many seconds have
    passed (after at least 3 rounds). Returns {name: [ms per call, ...]} (CUDA: events on the
    current stream)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    names = list(fns)
    while True:
        shift = len(times[names[0]]) % len(names)
        for k in names[shift:] + names[:shift]:
            fn = fns[k]
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times[k].append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t0) * 1e3)
        n = len(next(iter(times.values())))
        elapsed = time.perf_counter() - start
        if budget_s is not None and n >= 3 and elapsed > budget_s:
            return times
        if n >= max_reps or (n >= reps and elapsed >= min_time):
            return times


def summarize(ms: list) -> dict:
    """Median and spread (interquartile range as a fraction of the median) of repeated timings."""
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    med = statistics.median(ms)
    return {"median_ms": med, "iqr_frac": (q[2] - q[0]) / med if med > 0 else 0.0, "reps": len(ms)}
