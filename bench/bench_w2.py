"""Benchmark: W2^2 forward+backward, entangle_ext.wasserstein2_1d vs the plain-PyTorch composite.

The composite is what one writes without the operator, with autograd:
``((torch.sort(u).values - torch.sort(v).values) ** 2).mean(-1)``; for ragged inputs (equal
lengths of u and v per segment) the same on rows padded with +inf, masked. Both are timed in the
same run, on the same inputs, in alternation (A B A B ...), and the table gives the median time of
each, the spread (interquartile range / median) and the ratio composite / ours against its target
(CPU: >= 1.0 everywhere, >= 1.5 on most shapes; CUDA: >= 5 at 64x512, 4096x128 and the ragged
cases, >= 3 at 1x2^20). The JSON file is rewritten after every case, so a run stopped by
--time-budget (or killed) keeps what it measured.

    python bench/bench_w2.py --device cpu --json bench/results/w2_cpu.json
    python bench/bench_w2.py --device cuda --time-budget 60 --json w2_cuda.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, save_json, summarize, time_interleaved  # noqa: E402

import entangle_ext as ee  # noqa: E402

DENSE = [(1, 128), (64, 512), (1024, 256), (4096, 128), (16, 65536), (1, 1 << 20)]
CUDA_TARGETS = {"64x512": 5.0, "4096x128": 5.0, "ragged10": 5.0, "ragged-mix": 5.0, "1x1048576": 3.0}


def target(case: str, device: str) -> float:
    if device == "cuda":
        return CUDA_TARGETS.get(case, 1.0)
    return 1.0  # CPU: >= 1.0 everywhere (>= 1.5 on most, see the summary line)


def dense_composite(u, v):
    return ((torch.sort(u, dim=-1).values - torch.sort(v, dim=-1).values) ** 2).mean(-1)


def padded_composite(off: torch.Tensor):
    """The composite on rows padded with +inf (equal lengths of u and v per segment)."""
    lengths = off.diff()
    L = int(lengths.max())
    mask = torch.arange(L, device=off.device) < lengths[:, None]

    def fn(u, v):
        def rows(x):
            return x.new_full(mask.shape, float("inf")).masked_scatter(mask, x).sort(-1).values
        d = torch.where(mask, rows(u) - rows(v), 0.0)
        return (d * d).sum(-1) / lengths
    return fn


def make_cases(dtype, dev, g):
    cases = []
    for S, n in DENSE:
        cases.append((f"{S}x{n}", torch.randn(S, n, generator=g, dtype=dtype),
                      torch.randn(S, n, generator=g, dtype=dtype), None))
    for name, lengths in (("ragged10", torch.randint(5, 16, (20000,), generator=g)),
                          ("ragged-mix", torch.exp(torch.rand(256, generator=g) * 8.3).long() + 1)):
        off = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        n = int(off[-1])
        cases.append((name, torch.randn(n, generator=g, dtype=dtype),
                      torch.randn(n, generator=g, dtype=dtype), off))
    return [(name, u.to(dev), v.to(dev), None if off is None else off.to(dev)) for name, u, v, off in cases]


def fwd_bwd(fn, u, v):
    def run():
        u.grad = v.grad = None
        fn(u, v).sum().backward()
    return run


def run_case(name, u, v, off, dev, args):
    u.requires_grad_(True)
    v.requires_grad_(True)
    if off is None:
        comp = dense_composite
        ours = lambda a, b, val: ee.wasserstein2_1d(a, b, validate=val)  # noqa: E731
    else:
        comp = padded_composite(off)
        ml = int(off.diff().max())
        ours = lambda a, b, val: ee.wasserstein2_1d(a, b, off, off, max_seqlen=ml, validate=val)  # noqa: E731
    fns = {"composite": fwd_bwd(comp, u, v), "ours": fwd_bwd(lambda a, b: ours(a, b, False), u, v)}
    if dev.type == "cpu":  # validation is folded into the CPU kernel: show what it costs
        fns["ours_validated"] = fwd_bwd(lambda a, b: ours(a, b, True), u, v)
    reps = args.reps if u.numel() < (1 << 19) or dev.type == "cuda" else max(5, args.reps // 3)
    times = time_interleaved(fns, dev, reps=reps, min_time=args.min_time)
    row = {"case": name, "values_per_side": u.numel(), **{k: summarize(t) for k, t in times.items()}}
    row["ratio"] = row["composite"]["median_ms"] / row["ours"]["median_ms"]
    row["target"] = target(name, dev.type)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--reps", type=int, default=15, help="repetitions per case (at least)")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of repetitions per case (at least)")
    ap.add_argument("--time-budget", type=float, default=None, help="start no case after this many seconds")
    ap.add_argument("--json", default=None, help="write results here (JSON, after every case)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not ee.available():
        sys.exit(f"entangle_ext not loaded: {ee.load_error()}")
    dev = torch.device(args.device)
    env = environment(dev)
    payload = {"benchmark": "w2_forward_backward", "dtype": args.dtype, **env,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "rows": []}
    print(f"W2^2 forward+backward, {args.dtype}, {env['device_name']}, torch {torch.__version__}, "
          f"{env['threads']} threads; median ms (spread = IQR/median)")
    print(f"{'case':>12} {'composite':>16} {'entangle':>16} {'ratio':>7} {'target':>7}"
          + (f" {'validated':>10}" if dev.type == "cpu" else ""))
    t_start = time.perf_counter()
    for name, u, v, off in make_cases(getattr(torch, args.dtype), dev, torch.Generator().manual_seed(0)):
        if args.time_budget is not None and time.perf_counter() - t_start > args.time_budget:
            print(f"time budget of {args.time_budget:.0f} s spent; skipping {name} and later cases")
            payload["stopped_by_time_budget"] = True
            break
        r = run_case(name, u, v, off, dev, args)
        payload["rows"].append(r)
        c, o = r["composite"], r["ours"]
        ok = "ok" if r["ratio"] >= r["target"] else "BELOW"
        extra = f" {r['ours_validated']['median_ms']:10.3f}" if "ours_validated" in r else ""
        print(f"{name:>12} {c['median_ms']:9.3f} ±{100 * c['iqr_frac']:3.0f}% {o['median_ms']:9.3f} "
              f"±{100 * o['iqr_frac']:3.0f}% {r['ratio']:6.2f}x {r['target']:5.1f}x {ok}{extra}", flush=True)
        save_json(args.json, payload, quiet=True)
    rows = payload["rows"]
    if rows:
        good = sum(r["ratio"] >= 1.5 for r in rows)
        below = [r["case"] for r in rows if r["ratio"] < r["target"]]
        print(f"summary: {len(rows) - len(below)}/{len(rows)} cases at target"
              + (f" (below: {', '.join(below)})" if below else "")
              + (f"; {good}/{len(rows)} at >= 1.5x" if dev.type == "cpu" else ""))
    if args.json:
        print(f"saved {args.json}")


if __name__ == "__main__":
    main()
