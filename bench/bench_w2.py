"""Benchmark: W2^2 forward+backward, entangle_ext.wasserstein2_1d vs the plain-PyTorch composite.

The composite is what one writes without the operator: ``torch.sort`` of both sides and autograd
(``((sort(u) - sort(v))**2).mean(-1)``, entangle_ext.reference.wasserstein2_1d); for the ragged
case it is the reference's loop over segments. Both are timed in the same run, on the same inputs.

    python bench/bench_w2.py --device cuda --json bench/results/w2_cuda.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, save_json, time_fn  # noqa: E402

import entangle_ext as ee  # noqa: E402
from entangle_ext import reference as ref  # noqa: E402

DENSE = [(1, 128), (64, 512), (1024, 256), (4096, 128), (16, 65536), (1, 1 << 20)]


def fwd_bwd(fn, u, v):
    def run():
        u.grad = None
        fn(u, v).sum().backward()
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None, help="write results here (JSON)")
    args = ap.parse_args(argv)
    if not ee.available():
        sys.exit(f"entangle_ext not loaded: {ee.load_error()}")
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    rows = []
    print(f"W2^2 forward+backward, {args.dtype}, {environment(dev)['device_name']}, torch {torch.__version__}")
    print(f"{'case':>16} {'composite ms':>13} {'entangle ms':>12} {'speed-up':>9}")
    cases = [(f"{S}x{n}", torch.randn(S, n, generator=g, dtype=dtype), torch.randn(S, n, generator=g, dtype=dtype),
              None, None) for S, n in DENSE]
    lu = torch.randint(64, 1025, (64,), generator=g)
    lv = torch.randint(64, 1025, (64,), generator=g)
    uo = torch.cat([torch.zeros(1, dtype=torch.long), lu.cumsum(0)])
    vo = torch.cat([torch.zeros(1, dtype=torch.long), lv.cumsum(0)])
    cases.append(("ragged64(64-1024)", torch.randn(int(uo[-1]), generator=g, dtype=dtype),
                  torch.randn(int(vo[-1]), generator=g, dtype=dtype), uo, vo))
    for name, u, v, uo_, vo_ in cases:
        u = u.to(dev).requires_grad_(True)
        v = v.to(dev).requires_grad_(True)
        if uo_ is None:
            comp = fwd_bwd(lambda a, b: ref.wasserstein2_1d(a, b), u, v)
            ours = fwd_bwd(lambda a, b: ee.wasserstein2_1d(a, b, validate=False), u, v)
        else:
            uo_d, vo_d = uo_.to(dev), vo_.to(dev)
            ml = int(max(lu.max(), lv.max()))
            comp = fwd_bwd(lambda a, b: ref.wasserstein2_1d(a, b, uo_, vo_), u, v)
            ours = fwd_bwd(lambda a, b: ee.wasserstein2_1d(a, b, uo_d, vo_d, validate=False, max_seqlen=ml), u, v)
        reps = args.reps if u.numel() < (1 << 19) or dev.type == "cuda" else max(3, args.reps // 4)
        t_c = time_fn(comp, dev, reps=reps)
        t_o = time_fn(ours, dev, reps=reps)
        rows.append({"case": name, "composite_ms": t_c, "entangle_ms": t_o, "speedup": t_c / t_o})
        print(f"{name:>16} {t_c:13.4f} {t_o:12.4f} {t_c / t_o:8.2f}x", flush=True)
    save_json(args.json, {"benchmark": "w2_forward_backward", "dtype": args.dtype, **environment(dev), "rows": rows})


if __name__ == "__main__":
    main()
