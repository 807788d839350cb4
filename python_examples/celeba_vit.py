"""CelebA / ViT, the paper's attribute setting (method.md, CelebA row).

4 target classes = (Male, Smiling); sub-classes by (Young, Eyeglasses). D_f = female · not smiling ·
not young · no eyeglasses; D_adj = the other 3 sub-classes of "female · not smiling"; D_rem = the other
3 target classes. Train = official partition 0, held-out = partition 2. Data: torchvision's layout
(``<root>/celeba/img_align_celeba/*.jpg``, ``list_attr_celeba.txt``, ``list_eval_partition.txt``).

Model: torchvision ViT-B/32 from a local ImageNet state dict (``--weights``, never downloaded);
without it a small ViT from scratch at 64×64 (not the paper's model). The original model is trained
once and cached under ``--out`` (or loaded from ``--checkpoint``).

    python python_examples/celeba_vit.py --data-root /data --weights vit_b_32.pth --device cuda
    # no CelebA offline: smoke-run the whole pipeline on a *generated* miniature in the exact format
    python python_examples/celeba_vit.py --make-miniature runs/celeba_mini --reduced --out runs/celeba_smoke

The miniature's images are random noise and its attributes random: its accuracies mean nothing; it
only shows that loading, training, both stages and the report run.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

import entangle_ext as ee
from entangle_ext.data.celeba import celeba_splits
from entangle_ext.data.vit import vit_classifier
from entangle_ext.settings_cli import train_vision_original

ATTRS = ("5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair "
         "Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup "
         "High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose "
         "Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
         "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young").split()


def make_miniature(root, n=600, seed=0):
    """Write a generated CelebA miniature (random 178×218 JPEGs, random ±1 attributes, partitions
    80/10/10 %) in torchvision's layout under ``root/celeba``. Returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    d = Path(root) / "celeba"
    (d / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    vals = rng.choice([-1, 1], (n, len(ATTRS)))
    part = rng.choice([0, 1, 2], n, p=[0.8, 0.1, 0.1])
    lines = [str(n), " ".join(ATTRS)]
    for i in range(n):
        name = f"{i + 1:06d}.jpg"
        Image.fromarray(rng.integers(0, 256, (218, 178, 3), dtype=np.uint8)).save(d / "img_align_celeba" / name,
                                                                                   quality=60)
        lines.append(name + " " + " ".join(f"{v:2d}" for v in vals[i]))
    (d / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (d / "list_eval_partition.txt").write_text("".join(f"{i + 1:06d}.jpg {p}\n" for i, p in enumerate(part)))
    return Path(root)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None, help="dir holding celeba/ (torchvision layout)")
    ap.add_argument("--make-miniature", default=None, metavar="DIR", help="write a generated miniature there and use it")
    ap.add_argument("--weights", default=None, help="local ViT-B/32 ImageNet state dict (.pth)")
    ap.add_argument("--checkpoint", default=None, help="original model state dict (skips training; written if absent)")
    ap.add_argument("--out", default="runs/celeba_vit")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", choices=["reference", "paper"], default="reference")
    ap.add_argument("--reduced", action="store_true", help="≤ 300 train / 50 test images per target class, small ViT")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--original-epochs", type=int, default=None)
    ap.add_argument("--stage1-lr", type=float, default=None)
    ap.add_argument("--stage2-lr", type=float, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = make_miniature(args.make_miniature, seed=args.seed) if args.make_miniature else args.data_root
    if root is None:
        raise SystemExit("pass --data-root (dir holding celeba/) or --make-miniature DIR")
    out = Path(args.out)
    t0 = time.perf_counter()
    splits, info = celeba_splits(root, image_size=args.image_size, max_train_per_class=300 if args.reduced else None,
                                 max_test_per_class=50 if args.reduced else None, seed=args.seed, device=args.device)
    print("sizes:", info["sizes"], "| classes:", info["class_names"])
    pretrained = args.weights is not None
    model = vit_classifier(info["num_classes"], arch="vit_b_32" if pretrained else "small", weights=args.weights,
                           image_size=args.image_size)
    print("model:", "ViT-B/32 from " + args.weights if pretrained else "small ViT from scratch (not the paper's ViT-B/32)")
    ckpt = args.checkpoint or out / f"original_{'vitb32' if pretrained else 'small'}_seed{args.seed}.pt"
    train_vision_original(model, splits, pretrained=pretrained, device=args.device, seed=args.seed, cache=ckpt,
                          epochs=args.original_epochs or (5 if args.reduced else None), progress=not args.no_progress)
    print(f"original model ready ({time.perf_counter() - t0:.0f}s)")
    cfg = ee.UnlearnConfig.preset("celeba", recipe=args.recipe, seed=args.seed, eval_batch_size=256)
    if args.reduced:
        cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=1, forget_batch_limit=2, remote_batch_limit=2)
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
