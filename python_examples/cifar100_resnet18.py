"""CIFAR-100 / ResNet-18, the paper's Table 1 setting (method.md).

20 superclasses are the labels; D_f = fine class "aquarium_fish", D_adj = the other 4 fish
(flatfish, ray, shark, trout), D_rem = the other 19 superclasses. The original ResNet-18 (CIFAR stem)
is trained from scratch as in method.md (SGD 1e-3, momentum 0.9, wd 5e-4, cosine, 30 epochs, batch
256, flip + crop augmentation) and cached; then `entangle_ext.unlearn` runs the "cifar100" preset.

    python python_examples/cifar100_resnet18.py --device cuda --out runs/cifar100     # full (GPU)
    python python_examples/cifar100_resnet18.py --reduced --out runs/cifar100_reduced  # CPU, minutes

``--reduced``: 3 superclasses (fish, flowers, insects), 60 train / 20 test images per fine class,
6 original epochs at batch 64 / lr 0.05, and Stage 2 with 2 epochs, batch limit 2 and a smaller
adjacent batch. It keeps the paper's Stage-1/2 learning rates, which are tuned for a fully trained
20-class model and barely move the weak reduced model; ``--stage1-lr`` / ``--stage2-lr`` /
``--stage2-epochs`` override them (e.g. 5e-4 / 1e-2 / 5).
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

import entangle_ext as ee
from entangle_ext.data.cifar100 import cifar100_splits, find_cifar100, resnet18_cifar
from entangle_ext.train import train_original


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default="runs/cifar100_resnet18")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", choices=["reference", "paper"], default="reference")
    ap.add_argument("--reduced", action="store_true", help="small CPU run (see module docstring)")
    ap.add_argument("--stage1-lr", type=float, default=None)
    ap.add_argument("--stage2-lr", type=float, default=None)
    ap.add_argument("--stage2-epochs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    src = find_cifar100(args.data_root)
    if src is None:
        raise SystemExit("CIFAR-100 not found: pass --data-root (cifar100.npz or a dir with cifar-100-python/)")
    out = Path(args.out)
    t0 = time.perf_counter()
    if args.reduced:
        splits, info = cifar100_splits(src, superclasses=["fish", "flowers", "insects"], max_train_per_class=60,
                                       max_test_per_class=20, seed=args.seed, device=args.device)
        train_kw = dict(epochs=6, lr=0.05, batch_size=64)
    else:
        splits, info = cifar100_splits(src, seed=args.seed, device=args.device)
        train_kw = dict(epochs=30, lr=1e-3, batch_size=256)
    print("sizes:", info["sizes"], "| classes:", info["num_classes"], "| adjacent:", info["groups"]["adjacent"])
    torch.manual_seed(args.seed)   # the initial weights of the original model come from --seed
    model = resnet18_cifar(info["num_classes"])
    train_original(model, [splits.forget, splits.adjacent, splits.remote], momentum=0.9, weight_decay=5e-4,
                   cosine=True, augment=True, device=args.device, seed=args.seed,
                   cache=out / f"original_{'reduced' if args.reduced else 'full'}_seed{args.seed}.pt",
                   progress=not args.no_progress, **train_kw)
    print(f"original model ready ({time.perf_counter() - t0:.0f}s)")
    cfg = ee.UnlearnConfig.preset("cifar100", recipe=args.recipe, seed=args.seed, eval_batch_size=256)
    if args.reduced:
        cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=2, adjacent_batch_size=64, forget_batch_limit=2,
                                         remote_batch_limit=2, remote_batch_size=256, micro_batch=256)
    if args.stage1_lr is not None:
        cfg.stage1 = dataclasses.replace(cfg.stage1, lr=args.stage1_lr)
    if args.stage2_lr is not None:
        cfg.stage2 = dataclasses.replace(cfg.stage2, lr=args.stage2_lr)
    if args.stage2_epochs is not None:
        cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=args.stage2_epochs)
    res = ee.unlearn(model, splits, cfg, device=args.device, out_dir=out, progress=not args.no_progress)
    if args.no_progress:
        print(res.table)
    print(f"timings: {res.report['timings_s']} | total {time.perf_counter() - t0:.0f}s | report {out}/report.json")
    return res


if __name__ == "__main__":
    main()
