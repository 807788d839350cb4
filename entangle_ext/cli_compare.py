"""``entangle-unlearn compare``: every method on a registered setting, over seeds, in one table.

    entangle-unlearn compare --setting digits --methods all --seeds 3 --out runs/compare_digits
    python -m entangle_ext compare --setting cifar100 --variant reduced --methods retrain,two_stage,salun

Trains (or loads from ``--out``) the setting's original model with `entangle_ext.settings.prepare`,
then runs `entangle_ext.compare` and prints the markdown table: every method gets the setting's
``--hparams`` preset (docs/algorithm.md §10), the two-stage family the variant's config, and Retrain
a fresh model of the setting trained with the variant's recipe (`entangle_ext.settings`).
``--out`` holds ``comparison.md``, ``comparison.json``, ``comparison.png``, the cached original model
and ``cache/`` (one file per finished (method, seed) run: rerunning the same command resumes where
it stopped).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from .methods import HPARAMS, available_methods
    from .settings import SETTINGS

    variants = sorted({v.name for s in SETTINGS.values() for v in s.variants})
    ap = argparse.ArgumentParser(prog="entangle-unlearn compare", description="Compare unlearning methods on a "
                                 "registered setting: mean ± std over seeds (docs/algorithm.md §10).")
    ap.add_argument("--setting", choices=list(SETTINGS), required=True)
    ap.add_argument("--variant", choices=variants, default=None, help="size of the setting (reduced, cpu, lite0 = CPU runs)")
    ap.add_argument("--methods", default="all", help="'all' or a comma list of: " + ", ".join(available_methods())
                    + " (entangle_ext.available_methods())")
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds (0 .. N-1, shifted by --first-seed)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--hparams", choices=HPARAMS, default="paper_code",
                    help="presets: paper_code (the paper's released code; the reference recipe of the two-stage "
                    "family) or original (the baseline authors' defaults; the paper's own recipe)")
    ap.add_argument("--out", default=None, help="output dir (default runs/compare_<setting>)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--weights", default=None, help="tinyimagenet / celeba: local ViT-B/32 state dict")
    ap.add_argument("--model-path", default=None, help="toxigen: local Hugging Face model dir")
    ap.add_argument("--model-seed", type=int, default=0, help="seed of the data selection and original model")
    ap.add_argument("--relearn-steps", type=int, default=None, help="cap of the relearn-time fine-tuning")
    ap.add_argument("--no-relearn", action="store_true", help="skip relearn time")
    ap.add_argument("--mia-max-samples", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _methods(spec: str):
    from .compare import available_methods

    names = available_methods() if spec.strip() == "all" else [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods is empty")
    return names


def main(argv=None) -> int:
    """Entry point of ``entangle-unlearn compare``. Returns the exit code (0 success, 2 bad input:
    a ValueError / FileNotFoundError / missing-package message is printed)."""
    from .compare import compare
    from .settings import get_setting, prepare

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or f"runs/compare_{args.setting}"
    t0 = time.perf_counter()
    try:
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        setting = get_setting(args.setting)
        opts = {"weights": args.weights, "model_path": args.model_path}
        data = {k: v for k, v in opts.items() if v is not None and k in setting.data_options}
        model = {k: v for k, v in opts.items() if v is not None and k in setting.model_options}
        variant = setting.variant(args.variant, given=set(data) | set(model))
        methods = _methods(args.methods)
        run = prepare(args.setting, variant.name, data_root=args.data_root, seed=args.model_seed, device=args.device,
                      cache_dir=out, progress=not args.no_progress, data=data, model=model)

        relearn = False if args.no_relearn else ({"max_steps": args.relearn_steps} if args.relearn_steps else None)
        res = compare(run.model, run.splits, methods, list(range(args.first_seed, args.first_seed + args.seeds)),
                      setting=args.setting, variant=variant.name, hparams=args.hparams, out_dir=out,
                      device=args.device, model_fn=run.fresh_model, relearn=relearn,
                      mia_max_samples=args.mia_max_samples, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"entangle-unlearn compare: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.setting} ({variant.name}: {variant.summary}), {len(res.seeds)} seed(s)\n")
    print(res.table)
    print(f"\nwrote {res.paths['markdown']}, {res.paths['json']}, {res.paths['png']} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
