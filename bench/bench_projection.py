"""Benchmark of entangle_ext.project_orthogonal_ (fused multi-tensor projection) against the
plain-PyTorch baselines: (a) the flattened composite (torch.cat -> matmul -> solve -> split) and
(b) the per-parameter float64 loop (the reference recipe's style), in the same run.

Workloads: flat vectors of P elements (split into one tensor; default P = 11.2M on CPU,
{11.2M, 88M, 125M} on CUDA) and the real parameter lists of torchvision resnet18 and ViT-B/32
(skipped when torchvision is missing); k in {2, 4, 8}. Timing: torch.cuda.Event with warmup on
CUDA, time.perf_counter median on CPU. Achieved bandwidth counts the two-pass floor
(2k+3) * 4 * P bytes (float32) and is compared with a measured device-copy bandwidth.

    python bench/bench_projection.py --device cpu --json bench_projection_cpu.json
    python bench/bench_projection.py --device cuda --sizes 11.2e6,88e6,125e6
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import entangle_ext as ee  # noqa: E402
from entangle_ext import reference as ref  # noqa: E402


def timer(device, fn, reps, warmup):
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device, reps, warmup):
    n = (256 << 20) // 4 if device.type == "cuda" else (64 << 20) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = timer(device, lambda: dst.copy_(src), reps, warmup)
    return 2 * 4 * n / t / 1e9  # GB/s (read + write)


def model_shapes(name):
    try:
        import torchvision
    except ImportError:
        return None
    m = torchvision.models.resnet18(weights=None) if name == "resnet18" else \
        torchvision.models.vit_b_32(weights=None)
    return [tuple(p.shape) for p in m.parameters()]


def make(shapes, k, device, gen):
    grads = [torch.randn(s, generator=gen).to(device) for s in shapes]
    basis = [[torch.randn(s, generator=gen).to(device) for s in shapes] for _ in range(k)]
    return grads, basis


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated flat sizes P (default: 11.2e6 on CPU, 11.2e6,88e6,125e6 on CUDA)")
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--models", default="resnet18,vit_b_32", help="comma-separated, or 'none'")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-loop", action="store_true", help="skip the (slow) per-parameter loop baseline")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but no CUDA device is available")
    if not ee.available():
        sys.exit(f"entangle_ext not built: {ee.load_error()}")
    reps = args.reps or (20 if device.type == "cuda" else 5)
    warmup = 3 if device.type == "cuda" else 1
    sizes = [int(float(s)) for s in (args.sizes or ("11.2e6" if device.type == "cpu" else
                                                     "11.2e6,88e6,125e6")).split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    workloads = [(f"flat P={p / 1e6:g}M", [(p,)]) for p in sizes]
    for name in ([] if args.models == "none" else args.models.split(",")):
        shapes = model_shapes(name)
        if shapes is None:
            print(f"# torchvision missing: skipping {name}")
            continue
        workloads.append((f"{name} ({len(shapes)} tensors)", shapes))

    bw = copy_bandwidth(device, reps, warmup)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        (platform.processor() or platform.machine()) + f" ({torch.get_num_threads()} threads)"
    print(f"# device: {dev_name} | torch {torch.__version__} | copy bandwidth {bw:.1f} GB/s")
    hdr = (f"{'workload':28s} {'k':>2s} {'P':>11s} {'fused ms':>9s} {'GB/s':>7s} {'%copy':>6s} "
           f"{'flat ms':>9s} {'loop ms':>9s} {'flat/fused':>10s} {'loop/fused':>10s}")
    print(hdr)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for wname, shapes in workloads:
        P = sum(int(torch.Size(s).numel()) for s in shapes)
        for k in ks:
            grads, basis = make(shapes, k, device, gen)
            work = [g.clone() for g in grads]
            t_fused = timer(device, lambda: ee.project_orthogonal_(work, basis), reps, warmup)
            t_flat = timer(device, lambda: ref.project_orthogonal_flat_composite(work, basis), reps, warmup)
            t_loop = None
            if not args.no_loop:
                t_loop = timer(device, lambda: ref.project_orthogonal_loop(work, basis),
                               max(1, reps // 2), 1)
            gbs = (2 * k + 3) * 4 * P / t_fused / 1e9
            row = dict(workload=wname, k=k, P=P, tensors=len(shapes), fused_s=t_fused, flat_s=t_flat,
                       loop_s=t_loop, fused_GBps=gbs, copy_GBps=bw, flat_over_fused=t_flat / t_fused,
                       loop_over_fused=None if t_loop is None else t_loop / t_fused)
            rows.append(row)
            loop_ms = "-" if t_loop is None else f"{t_loop * 1e3:9.2f}"
            loop_ratio = "-" if t_loop is None else f"{t_loop / t_fused:10.2f}"
            print(f"{wname:28s} {k:2d} {P:11d} {t_fused * 1e3:9.2f} {gbs:7.1f} {100 * gbs / bw:6.1f} "
                  f"{t_flat * 1e3:9.2f} {loop_ms:>9s} {t_flat / t_fused:10.2f} {loop_ratio:>10s}", flush=True)
            del grads, basis, work
    if args.json:
        meta = dict(device=dev_name, device_type=device.type, date=datetime.datetime.now().isoformat(),
                    torch=torch.__version__, entangle_ext=ee.__version__, copy_GBps=bw,
                    bytes_model="(2k+3)*4*P", threads=torch.get_num_threads())
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=rows), indent=2))
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
