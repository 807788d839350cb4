"""The paper's CIFAR-100 protocol end to end (called by scripts/gpu_paper_cifar100.sh).

ResNet-18 (CIFAR stem) superclass classifier trained from scratch on the full CIFAR-100 train set,
forget "aquarium_fish", adjacent = the other four fish classes, remote = the other 95 classes
(the ``cifar100`` setting, variant ``full``); then the method (``two_stage``) and its no-W2
ablation (``no_w2``) with the ``cifar100`` preset unchanged, both from the same original model.
Writes, after every phase (so a capped run still leaves what it finished):

    OUT_DIR/paper_cifar100.json   environment, recipe, per-phase wall clock, the held-out and
                                  train accuracies of the three splits for original / method /
                                  no-W2, the published figures, and (dry run) the prediction
    OUT_DIR/paper_cifar100.txt    the same as a table

The original-model recipe of this script (written into the JSON): SGD, lr 0.1, momentum 0.9,
weight decay 5e-4, cosine schedule, batch 512, 10 epochs, flip + 4 px translation, with
``TrainRecipe.amp="bf16"`` (bfloat16-autocast forwards, float32 loss and weights; the unlearning
runs are float32, as the preset is). It is ours, chosen to fit the time cap; the paper does not publish its recipe.

--dry-run: the same code path on the CPU with a tiny budget (1 train / 1 held-out image per fine
class, one original epoch, one step per stage; the warnings that its batches exceed its tiny
splits are silenced); it measures this machine's rates and prints the
predicted time of the full run on the GPU (see `predict`).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

PUBLISHED = {  # method.md / the paper's CIFAR-100 table: held-out forget / adjacent / remote accuracy (%)
    "original": (90.00, 80.00, 85.33), "two_stage": (2.33, 78.17, 81.10), "no_w2": (14.33, 87.00, 80.55)}
RECIPE = dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, schedule="cosine", batch_size=512,
              epochs=10, augment=True, crop_padding=4, amp="bf16")
FULL_TRAIN = 50_000      # CIFAR-100 train images (500 per fine class)
FULL_TEST = 10_000
# Assumed H200 throughput for ResNet-18 at 32x32 (images per second, forward + backward), used only
# by the dry run's prediction. Not measured: no GPU has run this code yet. Override with
# ENTANGLE_H200_RATE_BF16 / ENTANGLE_H200_RATE_FP32. An evaluation (forward only) image counts 1/3.
H200_RATE = {"bf16": float(os.environ.get("ENTANGLE_H200_RATE_BF16", 20_000)),
             "fp32": float(os.environ.get("ENTANGLE_H200_RATE_FP32", 9_000))}


class SampleCounter:
    """Counts the samples that enter ``model``'s forward, split by whether autograd records them
    (training forward + backward) or not (evaluation)."""

    def __init__(self, model: torch.nn.Module):
        self.train = self.eval = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        n = int(args[0].shape[0]) if args and torch.is_tensor(args[0]) else 0
        if torch.is_grad_enabled():
            self.train += n
        else:
            self.eval += n

    def take(self):
        out = (self.train, self.eval)
        self.train = self.eval = 0
        return out


def full_scale_work(cfg, epochs: int) -> dict:
    """Images through forward+backward ("train") and forward only ("eval") of each phase of the
    full-size run, from the preset's batch sizes and limits (docs/algorithm.md §2, §3): Stage 1 one
    pass over the remote set (95 fine classes × 500 = 47 500 images) in remote batches, each step
    also one forget batch; Stage 2 ``epochs`` passes over the adjacent set (2 000 images), each step
    one adjacent batch plus ``forget_batch_limit`` forget and ``remote_batch_limit`` remote batches;
    four evaluations of all six splits (60 000 images) per method."""
    n_forget, n_adj = 500, 2_000
    n_rem = FULL_TRAIN - n_forget - n_adj
    s1, s2 = cfg.stage1, cfg.stage2
    steps1 = math.ceil(n_rem / s1.remote_batch_size) * s1.epochs
    if s1.max_steps is not None:
        steps1 = min(steps1, s1.max_steps)
    steps2 = math.ceil(n_adj / s2.adjacent_batch_size) * s2.epochs
    per2 = (s2.adjacent_batch_size + s2.forget_batch_limit * s2.forget_batch_size
            + s2.remote_batch_limit * min(s2.remote_batch_size, n_rem))
    method = {"stage1": steps1 * (s1.remote_batch_size + s1.forget_batch_size), "stage2": steps2 * per2,
              "eval": 4 * (FULL_TRAIN + FULL_TEST)}
    return {"original": {"train": epochs * FULL_TRAIN}, "two_stage": method, "no_w2": dict(method),
            "steps": {"stage1": steps1, "stage2": steps2}}


def predict(work: dict, rates: dict) -> dict:
    """Seconds of each phase of the full run at ``rates`` (images per second: "orig" = forward +
    backward under bf16 autocast, "method" = float32 forward + backward); evaluation images count
    1/3 of a training image."""
    out = {"original": work["original"]["train"] / rates["orig"]}
    for m in ("two_stage", "no_w2"):
        w = work[m]
        out[m] = (w["stage1"] + w["stage2"] + w["eval"] / 3) / rates["method"]
    out["total"] = sum(out.values())
    return out


def environment() -> dict:
    import entangle_ext
    env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "entangle_ext": entangle_ext.__version__, "cuda_built": entangle_ext.cuda_built(),
           "host_cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   compute_capability=f"{p.major}.{p.minor}", cudnn=torch.backends.cudnn.version())
    return env


def table(result: dict) -> str:
    rows = [f"{'':10s} {'forget':>8s} {'adjacent':>9s} {'remote':>8s}   (held-out accuracy %)   "
            f"{'published':>24s}   wall s"]
    for name, label in (("original", "original"), ("two_stage", "method"), ("no_w2", "w/o W2")):
        r = result["runs"].get(name)
        pub = "/".join(f"{x:.2f}" for x in PUBLISHED[name])
        if r is None:
            rows.append(f"{label:10s} {'(not run)':>27s}   {'':22s} {pub:>24s}")
            continue
        acc = r["held_out"]
        rows.append(f"{label:10s} {acc['forget']:8.2f} {acc['adjacent']:9.2f} {acc['remote']:8.2f}   "
                    f"{'':22s} {pub:>24s}   {r['wall_s']:.1f}")
    t = result["phases_s"]
    rows.append("wall clock s: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
    for name in ("two_stage", "no_w2"):
        if name in result["runs"]:
            rows.append(f"{name} stages s: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                          result["runs"][name]["timings_s"].items()))
    return "\n".join(rows)


def write(out: Path, result: dict) -> None:
    (out / "paper_cifar100.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "paper_cifar100.txt").write_text(table(result) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (paper_cifar100.json / .txt)")
    ap.add_argument("--data", required=True, help="cifar100.npz (reassembled and checked by the .sh)")
    ap.add_argument("--work", required=True, help="scratch directory for the runs' checkpoints")
    ap.add_argument("--dry-run", action="store_true", help="tiny CPU run of the same code path + prediction")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import entangle_ext
    from entangle_ext.methods.two_stage import TwoStage
    from entangle_ext.settings import prepare

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_paper_cifar100: no CUDA device; use --dry-run on a CPU machine", file=sys.stderr)
        return 2
    recipe = dict(RECIPE, epochs=1) if args.dry_run else dict(RECIPE)
    data = {"max_train_per_class": 1, "max_test_per_class": 1} if args.dry_run else {}
    if args.dry_run:
        import warnings
        from entangle_ext.unlearn import BatchLargerThanSplitWarning
        warnings.simplefilter("ignore", BatchLargerThanSplitWarning)
    result = {"mode": "dry-run" if args.dry_run else "gpu", "environment": environment(), "seed": args.seed,
              "original_recipe": recipe, "data_caps": data,
              "setting": "cifar100/full: forget aquarium_fish, adjacent flatfish/ray/shark/trout, remote the rest",
              "published": PUBLISHED, "phases_s": {}, "runs": {}}
    t_all = time.perf_counter()

    t0 = time.perf_counter()
    run = prepare("cifar100", "full", data_root=args.data, seed=args.seed, device=device, cache_dir=None,
                  progress=False, data=data, train=recipe)
    if device.type == "cuda":
        torch.cuda.synchronize()
    result["phases_s"]["original"] = time.perf_counter() - t0
    result["split_sizes"] = {k: len(getattr(run.splits, k)) for k in ("forget", "adjacent", "remote")}
    write(out, result)
    print(f"original model: {result['phases_s']['original']:.1f} s", flush=True)

    base = TwoStage.config_for("cifar100", "paper_code")
    cfg = None
    if args.dry_run:
        cfg = dataclasses.replace(base, stage1=dataclasses.replace(base.stage1, max_steps=1),
                                  stage2=dataclasses.replace(base.stage2, epochs=1))
    counts = {}
    for method in ("two_stage", "no_w2"):
        model = copy.deepcopy(run.model)
        counter = SampleCounter(model)
        t0 = time.perf_counter()
        res = entangle_ext.unlearn(model, run.splits, cfg, method=method, setting="cifar100", hparams="paper_code",
                                   seed=args.seed, device=device, out_dir=work / method, progress=False)
        wall = time.perf_counter() - t0
        counter.handle.remove()
        counts[method] = counter.take()
        ev = res.report["evals"]["final"]
        result["runs"][method] = {
            "wall_s": wall, "timings_s": res.report["timings_s"], "steps": res.report["steps"],
            "held_out": {s: 100 * ev[f"{s}_test"]["acc"] for s in ("forget", "adjacent", "remote")},
            "train": {s: 100 * ev[s]["acc"] for s in ("forget", "adjacent", "remote")},
            "n_held_out": {s: ev[f"{s}_test"]["n"] for s in ("forget", "adjacent", "remote")}}
        if "original" not in result["runs"]:
            ev0 = res.report["evals"]["original"]
            result["runs"]["original"] = {
                "wall_s": result["phases_s"]["original"],
                "held_out": {s: 100 * ev0[f"{s}_test"]["acc"] for s in ("forget", "adjacent", "remote")},
                "train": {s: 100 * ev0[s]["acc"] for s in ("forget", "adjacent", "remote")}}
        result["phases_s"][method] = wall
        write(out, result)
        print(f"{method}: {wall:.1f} s", flush=True)
    result["phases_s"]["total"] = time.perf_counter() - t_all

    if args.dry_run:
        # measured here: images per second of the original training (bf16 autocast) and of the
        # method (float32; forward+backward and forward-only images pooled at 1/3 per forward)
        n_orig = result["split_sizes"]["forget"] + result["split_sizes"]["adjacent"] + result["split_sizes"]["remote"]
        n_orig *= recipe["epochs"]
        rates = {"orig": n_orig / result["phases_s"]["original"]}
        tr, evn = (sum(c[i] for c in counts.values()) for i in (0, 1))
        rates["method"] = (tr + evn / 3) / (result["phases_s"]["two_stage"] + result["phases_s"]["no_w2"])
        work_full = full_scale_work(base, RECIPE["epochs"])
        h200 = {"orig": H200_RATE["bf16"], "method": H200_RATE["fp32"]}
        result["prediction"] = {
            "full_scale_images": work_full, "measured_rates_here": rates, "assumed_h200_rates": h200,
            "predicted_s_here": predict(work_full, rates), "predicted_s_h200": predict(work_full, h200)}
        p = result["prediction"]["predicted_s_h200"]
        print(f"measured here: original {rates['orig']:.0f} img/s (bf16 autocast), method "
              f"{rates['method']:.0f} img/s (float32)")
        print("predicted H200 time of the full run (assumed rates, not measured: "
              f"{h200['orig']:.0f} img/s bf16 / {h200['method']:.0f} img/s float32): "
              + ", ".join(f"{k} {v:.0f} s" for k, v in p.items()))
        print(f"predicted time of the full run on this machine: {result['prediction']['predicted_s_here']['total']:.0f} s")
    write(out, result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
