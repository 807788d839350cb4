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


def save_json(path: str | None, payload: dict) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2))
    print(f"saved {p}")


def time_interleaved(fns: dict, device: torch.device, *, reps: int = 7, warmup: int = 1,
                     budget_s: float | None = None) -> dict:
    """Per-call times in ms of several functions, one call of each per round, round after round, so
    that the drifts of a shared machine hit all of them alike. Stops early (after at least 3 rounds)
    once budget_s seconds have passed. Returns {name: [ms, ...]}."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = {name: [] for name in fns}
    start = time.perf_counter()
    for r in range(reps):
        for name, fn in fns.items():
            if device.type == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times[name].append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
        if budget_s is not None and r >= 2 and time.perf_counter() - start > budget_s:
            break
    return times
