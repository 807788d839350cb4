"""End-to-end part of bench/bench_unlearn.py: the whole ``entangle_ext.unlearn`` call on the
``cifar100`` / ``cpu`` setting with its preset (the package's defaults for that variant, bf16
autocast included where the preset turns it on) against the naive float32 transcription of the
reference recipe (``naive_c0`` + ``naive_stage1`` + ``naive_stage2`` of
entangle_ext/reference/unlearn.py), from the same original model θ0, on the same splits and batch
order. The naive run passes contiguous (NCHW) image batches; the unlearn call what its
``channels_last`` field resolves to (``unlearn_channels_last`` in the JSON). The unlearn call is timed whole (its evaluations of θ0, Stage 1 and Stage 2 included);
the naive one has none; the JSON's ``unlearn_timings_s`` splits the call's time into its evaluations
and stages (the run report's ``timings_s``). The held-out accuracies of both are measured afterwards, untimed. Optional rows against the same
naive run: ``basis_every`` = r (ours), contiguous batches (``--contiguous-row``) and the preset on
a model compiled in place with ``torch.nn.Module.compile()`` (``--compile-row``; its
compilation is in its wall time)."""
from __future__ import annotations

import copy
import time

import entangle_ext as ee
from entangle_ext.reference.unlearn import (driver_order_stage1, iter_driver_order_stage2, naive_c0,
                                            naive_stage1, naive_stage2)
from entangle_ext.settings import get_setting, prepare
from entangle_ext.unlearn.precision import resolve_amp_for

HELD_OUT = ("forget_test", "adjacent_test", "remote_test")


def naive_unlearn(model, splits, cfg) -> None:
    """c0, Stage 1 and Stage 2 of ``cfg`` (an `UnlearnConfig` of the reference recipe) by the naive
    transcription, in place, in the model's dtype."""
    s1, s2 = cfg.stage1, cfg.stage2
    remote, forget = driver_order_stage1(splits, s1, seed=cfg.seed)
    c0 = naive_c0(model, remote)
    naive_stage1(model, remote, forget, lr=s1.lr, mu=s1.mu, clip=s1.clip, c0=c0, cycle=s1.forget_order == "cycle")
    naive_stage2(model, iter_driver_order_stage2(splits, s2, seed=cfg.seed), lr=s2.lr, alpha=s2.alpha,
                 momentum=s2.momentum)


def held_out(model, splits) -> dict:
    ev = ee.evaluate(model, splits)
    return {s: round(100 * ev[s]["acc"], 2) for s in HELD_OUT if s in ev}


def run(args, res: dict, save) -> float:
    """Time both on the cifar100/cpu setting (seed ``args.seed``; ``args.caps``: per-class data
    caps and a 1-epoch original model, for a quick check); returns naive / unlearn wall time."""
    data = {} if args.caps is None else {"max_train_per_class": args.caps, "max_test_per_class": args.caps}
    train = None if args.caps is None else {"epochs": 1}
    prep = prepare("cifar100", "cpu", seed=args.seed, device="cpu", cache_dir=args.cache_dir,
                   data_root=args.data_root, data=data, train=train, progress=False)
    cfg = get_setting("cifar100").config(prep.variant, seed=args.seed)
    if cfg.recipe != "reference":
        raise SystemExit(f"the naive transcription is of the reference recipe, the preset is {cfg.recipe!r}")
    cfg.amp = args.amp if args.amp != "preset" else cfg.amp
    out = res["end_to_end"] = {"setting": "cifar100/cpu", "seed": args.seed, "caps": args.caps,
                               "amp": cfg.amp, "amp_resolved": resolve_amp_for(cfg.amp, prep.model),
                               "basis_every": cfg.stage2.basis_every,
                               "micro_batch": cfg.stage2.micro_batch}
    print(f"# end to end: cifar100/cpu, seed {args.seed}, unlearn with amp={cfg.amp!r} "
          f"(-> {out['amp_resolved']!r}), basis_every="
          f"{cfg.stage2.basis_every}, micro_batch={cfg.stage2.micro_batch!r}; naive float32", flush=True)
    ours = copy.deepcopy(prep.model)
    t = time.perf_counter()
    result = ee.unlearn(ours, prep.splits, cfg, progress=False)
    out["unlearn_s"] = time.perf_counter() - t
    # where the unlearn call's time went (report["timings_s"]: eval_original, stage1, eval_stage1,
    # stage2, eval_stage2; "unlearn" = the two stages)
    out["unlearn_timings_s"] = {k: round(float(v), 3) for k, v in (result.report.get("timings_s") or {}).items()}
    out["unlearn_channels_last"] = result.report.get("channels_last")
    save()
    # rows of their own against the same naive run: basis_every = r != the preset's (ours, another
    # algorithm), with --contiguous-row the preset with channels_last=False, and with --compile-row
    # the preset on a model.compile()'d copy of the original
    alts = {f"basis_every={r}": ("basis_every_rows", str(r), {"basis_every": r})
            for r in dict.fromkeys(args.basis_every or []) if r != cfg.stage2.basis_every}
    if getattr(args, "contiguous_row", False):
        alts["channels_last=False"] = ("contiguous_row", None, {"channels_last": False})
    if getattr(args, "compile_row", False):
        alts["model.compile()"] = ("compile_row", None, {"compile": True})
    variants = {}
    for label, (key, sub, change) in alts.items():
        alt = copy.deepcopy(cfg)
        if "basis_every" in change:
            alt.stage2.basis_every = change["basis_every"]
        elif "channels_last" in change:
            alt.channels_last = change["channels_last"]
        variants[label] = copy.deepcopy(prep.model)
        if "compile" in change:
            # what a user can do today: compile the module in place (its state_dict keys stay),
            # then hand it to unlearn unchanged; the compilation time is inside the timed call
            variants[label].compile()
        t = time.perf_counter()
        rep = ee.unlearn(variants[label], prep.splits, alt, progress=False).report
        row = {"unlearn_s": time.perf_counter() - t,
               "unlearn_timings_s": {k: round(float(v), 3) for k, v in (rep.get("timings_s") or {}).items()}}
        if sub is None:
            out[key] = row
        else:
            out.setdefault(key, {})[sub] = row
        save()
    naive = copy.deepcopy(prep.model).float()
    t = time.perf_counter()
    naive_unlearn(naive, prep.splits, cfg)
    out["naive_s"] = time.perf_counter() - t
    out["held_out_acc_unlearn"] = held_out(ours, prep.splits)
    out["held_out_acc_naive"] = held_out(naive, prep.splits)
    out["held_out_acc_original"] = held_out(prep.model, prep.splits)
    out["speedup"] = out["naive_s"] / out["unlearn_s"]
    rows = {}
    for label, m in variants.items():
        key, sub, _ = alts[label]
        rows[label] = row = out[key] if sub is None else out[key][sub]
        row["held_out_acc"] = held_out(m, prep.splits)
        row["speedup"] = out["naive_s"] / row["unlearn_s"]
    save()
    for k in ("original", "naive", "unlearn"):
        print(f"held-out forget / adjacent / remote %, {k:8s}: "
              + " / ".join(f"{out['held_out_acc_' + k][s]:.2f}" for s in HELD_OUT), flush=True)
    print(f"wall: naive {out['naive_s']:.1f} s, unlearn {out['unlearn_s']:.1f} s (channels_last "
          f"{out['unlearn_channels_last']}; "
          + ", ".join(f"{k} {v:.1f} s" for k, v in out["unlearn_timings_s"].items()) + ")", flush=True)
    for label, row in rows.items():
        what = ("ours, changes the algorithm; not the preset" if label.startswith("basis_every")
                else "contiguous image batches; not the preset" if label.startswith("channels_last")
                else "the same preset on a torch.compile'd model, compilation included")
        print(f"{label} ({what}): unlearn {row['unlearn_s']:.1f} s ("
              + ", ".join(f"{k} {v:.1f} s" for k, v in row["unlearn_timings_s"].items()) + "), held-out "
              + " / ".join(f"{row['held_out_acc'][s]:.2f}" for s in HELD_OUT)
              + f", {row['speedup']:.2f}x the naive", flush=True)
    return out["speedup"]
