"""`python -m entangle_ext.demo` (run by `make demo`): the two-stage method on real data, CPU.

scikit-learn's bundled digits (1,797 real handwritten 8×8 digits) as a miniature of the paper's
superclass setting (docs/algorithm.md §1): the model predicts the coarse label parity (even/odd);
D_f = digit 3 (keeps its label "odd"), D_adj = the other odd digits 1, 5, 7, 9, D_rem = the even
digits. The "digits" entry of the settings registry (`entangle_ext.settings`) gives the data, the
2-layer MLP and its training recipe (Adam 1e-3, batch 64, 60 epochs; cached under
./.cache/entangle_demo/), then `entangle_ext.unlearn` runs Stage 1 and Stage 2 with the "digits"
preset and prints the three-split table (train and held-out).
Done-criterion: forget accuracy after Stage 2 ≤ 10 % and adjacent accuracy within 5 points of the
original.
"""
from __future__ import annotations

import argparse
import time
import warnings

from ._paths import expand_user
from .settings import get_setting, prepare
from .threads import default_threads, torch_threads
from .unlearn.entry import OutDirReusedWarning, unlearn

__all__ = ["main"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=expand_user, default="runs/demo_digits", help="report, plot and checkpoints")
    ap.add_argument("--cache", type=expand_user, default=".cache/entangle_demo", help="original-model cache dir")
    ap.add_argument("--seed", type=int, default=0, help="seeds the data split, the original model and the run")
    ap.add_argument("--recipe", default="reference", choices=["reference", "paper"],
                    help="reference code's loops or the paper's text (docs/algorithm.md §7)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars (the table is still printed)")
    args = ap.parse_args(argv)
    with torch_threads(default_threads(get_setting("digits").threads)):   # 1: the tiny MLP's fastest
        return _run(args)


def _run(args) -> dict:
    t0 = time.perf_counter()
    run = prepare("digits", seed=args.seed, device="cpu", cache_dir=args.cache, progress=not args.no_progress)
    print("digits superclass miniature: coarse label = parity;",
          ", ".join(f"{k}: digits {v}" for k, v in run.info["groups"].items()))
    print("sizes:", run.info["sizes"])
    cfg = run.config(recipe=args.recipe, seed=args.seed)
    with warnings.catch_warnings():   # a demo rewrites its own out dir on every run: not a mistake
        warnings.simplefilter("ignore", OutDirReusedWarning)
        res = unlearn(run.model, run.splits, cfg, device="cpu", out_dir=args.out, progress=not args.no_progress)
    if args.no_progress:
        print(res.table)
    ev = res.report["evals"]
    f_acc, adj0, adj2 = (100 * ev["stage2"]["forget_test"]["acc"], 100 * ev["original"]["adjacent_test"]["acc"],
                         100 * ev["stage2"]["adjacent_test"]["acc"])
    ok = f_acc <= 10 and abs(adj2 - adj0) <= 5
    print(f"\nheld-out: forget acc after Stage 2 = {f_acc:.1f}% (target <= 10), adjacent "
          f"{adj0:.1f}% -> {adj2:.1f}% (target within 5 points): {'PASS' if ok else 'MISS'}")
    print(f"report: {args.out}/report.json, histograms: {args.out}/forget_loss_hist.png, "
          f"total {time.perf_counter() - t0:.1f}s")
    return res.report


if __name__ == "__main__":
    main()
