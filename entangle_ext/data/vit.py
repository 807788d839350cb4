"""Vision Transformers for the Tiny-ImageNet and CelebA settings (docs/algorithm.md §8: ViT-B/32,
ImageNet-pretrained), built with torchvision, never downloading.

* ``arch="vit_b_32"``: `torchvision.models.vit_b_32`; ``weights`` = a local state-dict file (e.g.
  torchvision's ``vit_b_32-d86f8d99.pth`` copied by hand); the ImageNet head is replaced by a fresh
  ``Linear(768, num_classes)``; inputs are resized to 224×224 inside the model.
* ``arch="small"``: a small ViT trained from scratch (`torchvision.models.VisionTransformer`, patch 8,
  4 layers, 4 heads, width 128, MLP 256; ≈0.8 M parameters at 64×64) for CPU runs and for machines
  without the pretrained weights. It is *not* the paper's model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

import torch

from .._optional import optional_import
from .._paths import expand_user
from ..unlearn.files import read_torch_file

__all__ = ["setting_model", "vit_classifier", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class _Resize(torch.nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, x):
        if x.shape[-1] == self.size and x.shape[-2] == self.size:
            return x
        return torch.nn.functional.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)


def vit_classifier(num_classes: int, *, arch: str = "small", weights: Union[str, Path, None] = None,
                   image_size: int = 64) -> torch.nn.Module:
    """A ViT classifier: input (B, 3, H, W) float normalised with ImageNet mean/std, logits (B, num_classes).

    Args:
        num_classes: output classes (coarse labels of the setting).
        arch: "vit_b_32" (paper; 88 M parameters, input resized to 224) or "small" (from scratch,
            input ``image_size``).
        weights: local path of a ViT-B/32 state dict (a plain state dict, or a dict holding it under
            "model" / "state_dict"); head weights in it are ignored. None = random init (say so in
            reports: the paper fine-tunes ImageNet weights).
        image_size: "small" only: input side in pixels (divisible by 8).
    Raises:
        FileNotFoundError: ``weights`` does not exist. ValueError: unknown arch, weights with "small",
        a ``weights`` file that is not a readable torch file (corrupt, truncated, foreign:
        `read_torch_file`) or a state dict, or a state dict that does not fit ViT-B/32.
    """
    torchvision = optional_import("torchvision", "the ViT of the tinyimagenet / celeba settings", "vision")

    if arch == "small":
        if weights is not None:
            raise ValueError("weights are only supported for arch='vit_b_32'")
        if image_size % 8:
            raise ValueError("image_size must be divisible by the patch size 8")
        return torchvision.models.VisionTransformer(image_size=image_size, patch_size=8, num_layers=4, num_heads=4,
                                                    hidden_dim=128, mlp_dim=256, num_classes=num_classes)
    if arch != "vit_b_32":
        raise ValueError(f"arch must be 'small' or 'vit_b_32', got {arch!r}")
    m = torchvision.models.vit_b_32(weights=None)
    if weights is not None:
        p = Path(expand_user(weights))
        if not p.is_file():
            raise FileNotFoundError(f"no ViT-B/32 weights at {p} (pass a local .pth; nothing is downloaded)")
        sd = read_torch_file(p)   # ValueError, one line, for a corrupt, truncated or foreign file
        for key in ("model", "state_dict"):
            if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
                sd = sd[key]
        if not isinstance(sd, dict):
            raise ValueError(f"{p} holds a {type(sd).__name__}, not a state dict of torchvision vit_b_32")
        sd = {k: v for k, v in sd.items() if not k.startswith("heads.")}
        missing, unexpected = m.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.startswith("heads.")]
        if missing or unexpected:
            raise ValueError(f"{p} does not fit torchvision vit_b_32: missing {missing[:5]}, unexpected {unexpected[:5]}")
    m.heads.head = torch.nn.Linear(m.heads.head.in_features, num_classes)
    return torch.nn.Sequential(_Resize(224), m)


def setting_model(info, arch="small", weights=None, image_size=64):
    """The model builder of the tinyimagenet / celeba settings (``entangle_ext/settings.py``): a ViT (``arch`` "small"/"b32", optional local weights) or,
    for ``arch="lite0"``, the pretrained EfficientNet-Lite0 classifier of the CPU preset."""
    if arch == "lite0":
        if weights is not None:
            raise ValueError("the lite0 variant brings its own ImageNet weights; it takes no weights option")
        from .lite0 import Lite0Classifier   # (lite0 imports this module)
        return Lite0Classifier(info["num_classes"], image_size=image_size)
    return vit_classifier(info["num_classes"], arch=arch, weights=weights, image_size=image_size)
