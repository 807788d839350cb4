"""Benchmark of entangle_ext.project_orthogonal_ (fused two-pass projection, docs/algorithm.md §5)
against a device-to-device copy and the plain-PyTorch composite, measured in the same run.

For every case (flat vectors of P elements, one tensor, float32; k basis vectors) the script times,
in interleaved rounds (medians): the fused operator; a copy of a large buffer (torch's copy_, the
bandwidth yardstick); and the composite one writes without a kernel (flatten with torch.cat,
V @ V.T and V @ g, torch.linalg.solve, g - V.T @ c, split back; reference.
project_orthogonal_flat_composite). The operator must move (2k+3) * 4 * P bytes (pass 1 reads g
and V, pass 2 reads them again and writes g); achieved bandwidth on that model is printed as a
fraction of the copy's, and the composite's time as a ratio to the operator's, each against its
target. Optional: the per-parameter float64 loop (--loop) and torchvision models (--models).

    python bench/bench_projection.py --device cpu --json bench/results/projection_cpu.json
    python bench/bench_projection.py --device cuda --json bench/results/projection_cuda.json --time-budget 120
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, save_json, time_interleaved  # noqa: E402

import entangle_ext as ee  # noqa: E402
from entangle_ext import reference as ref  # noqa: E402

SIZES = {"cpu": "11.2e6,86e6", "cuda": "11.2e6,125e6"}
# Targets: fraction of copy bandwidth per k (CPU: 2 cores; CUDA: H200), composite time / ours.
COPY_TARGET = {"cpu": {2: 0.70, 8: 0.40}, "cuda": {2: 0.70, 8: 0.50}}
COMPOSITE_TARGET = 1.5


def model_shapes(name):
    try:
        import torchvision
    except ImportError:
        return None
    m = getattr(torchvision.models, name)(weights=None)
    return [tuple(p.shape) for p in m.parameters()]


def make(shapes, k, device):
    """Random float32 tensors drawn on the device itself (torch.manual_seed is set once)."""
    grads = [torch.randn(s, device=device) for s in shapes]
    basis = [[torch.randn(s, device=device) for s in shapes] for _ in range(k)]
    return grads, basis


def run_case(name, shapes, k, device, copy_fn, copy_bytes, args):
    P = sum(int(torch.Size(s).numel()) for s in shapes)
    grads, basis = make(shapes, k, device)
    fns = {"fused": lambda: ee.project_orthogonal_(grads, basis), "copy": copy_fn,
           "composite": lambda: ref.project_orthogonal_flat_composite(grads, basis)}
    if args.loop:
        fns["loop"] = lambda: ref.project_orthogonal_loop(grads, basis)
    times = time_interleaved(fns, device, reps=args.reps, budget_s=args.case_budget)
    med = {n: statistics.median(t) for n, t in times.items()}
    spread = {n: (min(t), max(t)) for n, t in times.items()}
    copy_gbs = copy_bytes / med["copy"] / 1e6
    fused_gbs = (2 * k + 3) * 4 * P / med["fused"] / 1e6
    row = dict(workload=name, k=k, P=P, tensors=len(shapes), rounds=len(times["fused"]),
               fused_ms=med["fused"], copy_ms=med["copy"], composite_ms=med["composite"],
               loop_ms=med.get("loop"), spread_ms=spread, fused_GBps=fused_gbs, copy_GBps=copy_gbs,
               frac_of_copy=fused_gbs / copy_gbs, composite_over_fused=med["composite"] / med["fused"],
               copy_target=COPY_TARGET[device.type].get(k), composite_target=COMPOSITE_TARGET)
    del grads, basis
    return row


def verdict(x, target):
    return "" if target is None else ("ok" if x >= target else "BELOW")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default=None, help="comma-separated flat sizes P (default: "
                    f"{SIZES['cpu']} on CPU, {SIZES['cuda']} on CUDA)")
    ap.add_argument("--ks", default="2,8")
    ap.add_argument("--models", default="none", help="torchvision models, comma-separated (e.g. resnet18)")
    ap.add_argument("--reps", type=int, default=None,
                    help="interleaved rounds per case (default 7 CPU, 20 CUDA)")
    ap.add_argument("--loop", action="store_true", help="also time the per-parameter float64 loop")
    ap.add_argument("--json", default=None, help="write the results here, updated after every case")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds for the whole run: cases that would start after it are skipped "
                         "(default: 45 on CUDA, none on CPU)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but no CUDA device is available")
    if not ee.available():
        sys.exit(f"entangle_ext not built: {ee.load_error()}")
    args.reps = args.reps or (20 if device.type == "cuda" else 7)
    if args.time_budget is None and device.type == "cuda":
        args.time_budget = 45.0
    sizes = (args.sizes or SIZES[device.type]).split(",")
    workloads = [(f"flat P={float(p) / 1e6:g}M", [(int(float(p)),)]) for p in sizes]
    for name in ([] if args.models == "none" else args.models.split(",")):
        shapes = model_shapes(name)
        if shapes is None:
            print(f"# torchvision missing: skipping {name}")
        else:
            workloads.append((f"{name} ({len(shapes)} tensors)", shapes))
    cases = [(w, s, int(k)) for w, s in workloads for k in args.ks.split(",")]
    args.case_budget = None if args.time_budget is None else args.time_budget / (2 * len(cases))

    n_copy = (1 << 28) if device.type == "cuda" else (1 << 26)  # 1 GiB / 256 MiB of float32
    src = torch.randn(n_copy, device=device)
    dst = torch.empty_like(src)
    env = environment(device)
    kernel = ee._ext._C.projection_cpu_kernel() if hasattr(ee._ext._C, "projection_cpu_kernel") else "?"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    meta = dict(benchmark="projection", **env, cpu_kernel=kernel, load_average_1min=load,
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                bytes_model="(2k+3)*4*P",
                copy_bytes=2 * 4 * n_copy, copy_targets=COPY_TARGET[device.type],
                composite_target=COMPOSITE_TARGET)
    print(f"# {env['device_name']} ({env['threads']} threads, CPU kernels: {kernel}, load average "
          f"{load}) | torch {torch.__version__}")
    print(f"{'workload':24s} {'k':>2s} {'fused ms':>9s} {'GB/s':>7s} {'copy GB/s':>9s} {'of copy':>8s} "
          f"{'target':>6s} {'composite ms':>12s} {'speed-up':>8s} {'target':>6s}")
    torch.manual_seed(0)
    rows, start = [], time.perf_counter()
    for name, shapes, k in cases:
        if args.time_budget is not None and time.perf_counter() - start > args.time_budget:
            print(f"# time budget spent: skipping {name} k={k}")
            continue
        row = run_case(name, shapes, k, device, lambda: dst.copy_(src), 2 * 4 * n_copy, args)
        rows.append(row)
        ct, st = row["copy_target"], row["composite_target"]
        print(f"{name:24s} {k:2d} {row['fused_ms']:9.2f} {row['fused_GBps']:7.1f} {row['copy_GBps']:9.1f} "
              f"{100 * row['frac_of_copy']:7.1f}% {'' if ct is None else f'>={100 * ct:.0f}%':>6s} "
              f"{row['composite_ms']:12.2f} {row['composite_over_fused']:7.2f}x {f'>={st:g}x':>6s}  "
              f"{verdict(row['frac_of_copy'], ct)} {verdict(row['composite_over_fused'], st)}", flush=True)
        save_json(args.json, dict(meta=meta, results=rows))


if __name__ == "__main__":
    main()
