"""Tiny-ImageNet / ViT, the paper's superclass setting (method.md, Tiny-ImageNet row).

The model predicts WordNet superclasses. Full layout (``tiny-imagenet-200/``): 10 superclasses
(`entangle_ext.data.tinyimagenet.DEFAULT_SUPERCLASSES`), D_f = the six dog classes, D_adj = the other
"mammal" classes, D_rem = the other 9 superclasses. Shared subset (``tinyimagenet_dogs_cats.npz``, 6 dog
breeds + 5 felines): superclasses (dog, feline), D_f = one breed (``--forget``, default Chihuahua),
D_adj = the other 5 breeds, D_rem = the felines. Held-out = the official val images.

Model: torchvision ViT-B/32 fine-tuned from ImageNet weights given as a local file (``--weights``,
never downloaded; inputs resized to 224). Without ``--weights``: a small ViT trained from scratch at
64×64 (not the paper's model). The original model is trained once (AdamW, cosine, flip/crop) and
cached under ``--out``, or loaded from ``--checkpoint``.

    python python_examples/tinyimagenet_vit.py --data-root /data/tiny-imagenet-200 --weights vit_b_32.pth --device cuda
    python python_examples/tinyimagenet_vit.py --reduced --out runs/tin_reduced          # CPU, npz subset

``--reduced``: the shared npz, 100 train / 50 val images per class, small ViT, 15 original epochs,
Stage 1 with 3 passes over D_rem and larger learning rates (``--stage1-lr`` / ``--stage2-lr``), Stage 2
with 2 epochs and a smaller adjacent batch.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

import entangle_ext as ee
from entangle_ext.data.tinyimagenet import find_tinyimagenet, tinyimagenet_splits
from entangle_ext.data.vit import vit_classifier
from entangle_ext.settings_cli import train_vision_original


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None, help="tiny-imagenet-200/ (or its parent) or the dogs/cats .npz")
    ap.add_argument("--weights", default=None, help="local ViT-B/32 ImageNet state dict (.pth)")
    ap.add_argument("--checkpoint", default=None, help="original model state dict (skips training; written if absent)")
    ap.add_argument("--forget", default=None, help="wnid / class name / hypernym (default: dog, or Chihuahua on the npz)")
    ap.add_argument("--superclasses", default=None, help="comma list of WordNet nodes (default: see module doc)")
    ap.add_argument("--out", default="runs/tinyimagenet_vit")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", choices=["reference", "paper"], default="reference")
    ap.add_argument("--reduced", action="store_true", help="small CPU run (see module docstring)")
    ap.add_argument("--max-train-per-class", type=int, default=None)
    ap.add_argument("--original-epochs", type=int, default=None)
    ap.add_argument("--stage1-lr", type=float, default=None)
    ap.add_argument("--stage2-lr", type=float, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    src = find_tinyimagenet(args.data_root)
    if src is None:
        raise SystemExit("Tiny-ImageNet not found: pass --data-root (tiny-imagenet-200/ or tinyimagenet_dogs_cats.npz)")
    out = Path(args.out)
    t0 = time.perf_counter()
    cap = args.max_train_per_class or (100 if args.reduced else None)
    splits, info = tinyimagenet_splits(src, forget=args.forget, superclasses=args.superclasses.split(",")
                                       if args.superclasses else None, max_train_per_class=cap,
                                       seed=args.seed, device=args.device)
    print("sizes:", info["sizes"], "| superclasses:", info["coarse_names"], "| forget:", info["forget_classes"],
          "| adjacent:", info["adjacent_classes"])
    pretrained = args.weights is not None
    model = vit_classifier(info["num_classes"], arch="vit_b_32" if pretrained else "small", weights=args.weights)
    print("model:", "ViT-B/32 from " + args.weights if pretrained else "small ViT from scratch (not the paper's ViT-B/32)")
    ckpt = args.checkpoint or out / f"original_{'vitb32' if pretrained else 'small'}_n{cap or 'all'}_seed{args.seed}.pt"
    train_vision_original(model, splits, pretrained=pretrained, device=args.device, seed=args.seed, cache=ckpt,
                          epochs=args.original_epochs or (15 if args.reduced else None),
                          batch_size=64 if args.reduced else 128, progress=not args.no_progress)
    print(f"original model ready ({time.perf_counter() - t0:.0f}s)")
    cfg = ee.UnlearnConfig.preset("tinyimagenet", recipe=args.recipe, seed=args.seed, eval_batch_size=256)
    if args.reduced:
        cfg.stage1 = dataclasses.replace(cfg.stage1, epochs=3, lr=args.stage1_lr or 2e-4, remote_batch_size=64,
                                         forget_batch_size=32)
        cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=2, lr=args.stage2_lr or 2e-3, adjacent_batch_size=64)
    else:
        if args.stage1_lr:
            cfg.stage1 = dataclasses.replace(cfg.stage1, lr=args.stage1_lr)
        if args.stage2_lr:
            cfg.stage2 = dataclasses.replace(cfg.stage2, lr=args.stage2_lr)
    res = ee.unlearn(model, splits, cfg, device=args.device, out_dir=out, progress=not args.no_progress)
    print(res.table)
    print(f"timings: {res.report['timings_s']} | total {time.perf_counter() - t0:.0f}s | report {out}/report.json")
    return res


if __name__ == "__main__":
    main()
