"""Training of the *original* model θ0 (before unlearning), with an on-disk cache.

One trainer for every setting: `train_original(model, datasets, recipe)`. A `TrainRecipe` holds the
optimizer, learning rate, epochs, batch size, schedule and augmentation; each setting's recipe lives
in the settings registry (`entangle_ext.settings`, docs/algorithm.md §8), e.g. the paper's CIFAR-100
ResNet-18 (SGD 1e-3, momentum 0.9, weight decay 5e-4, cosine, 30 epochs, batch 256, flip + crop).

Data order: one ``torch.Generator`` seeded with ``seed`` draws a fresh permutation of the union of
the datasets at each epoch and the augmentation randomness, so a run is a pure function of
(model initialisation, data, recipe, seed).
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ._paths import expand_user
from .unlearn.checkpoint import preserved_rng, seed_everything
from .unlearn.data import BatchStream, has_batchnorm, loss_logits, require_graph, split_batch, union_source
from .unlearn.files import WriteError, atomic_write, check_out_dir_type, make_out_dir, open_checkpoint
from .unlearn.config import ChannelsLast
from .unlearn.fields import MOMENTUM_RULE, check_fields
from .unlearn.inputs import model_device, training_grad_mode
from .unlearn.module_state import state_module, unwrapped_state
from .unlearn.memory_format import CHANNELS_LAST_CHOICES, channels_last_scope, resolve_channels_last
from .unlearn.precision import AMP_CHOICES, amp_scope, master_weight_optimizer, model_dtype, resolve_amp

__all__ = ["TrainRecipe", "train_original", "fit", "load_model_file", "cifar_augment", "CacheNotWrittenWarning"]

Optimizer = Literal["sgd", "adam", "adamw"]
Schedule = Literal["constant", "cosine"]


@dataclass(frozen=True)
class TrainRecipe:
    """How the original model is trained (docs/algorithm.md §8).

    Attributes:
        optimizer: "sgd" (with ``momentum``), "adam" or "adamw" (``torch.optim``, default betas/eps).
        lr: learning rate (peak value under "cosine").
        epochs: passes over the union of the training datasets (0 = leave the model as built).
        batch_size: samples per step (the last batch of an epoch may be smaller; for a model with
            BatchNorm a 1-sample tail is folded into the batch before it, see `BatchStream`
            in ``entangle_ext/unlearn/data.py``).
        momentum: SGD momentum (ignored by Adam/AdamW).
        weight_decay: the optimizer's weight decay (L2 for SGD/Adam, decoupled for AdamW).
        schedule: "constant", or "cosine" = `CosineAnnealingLR` over all steps, stepped per batch.
        augment: random horizontal flip + translation by up to ``crop_padding`` pixels
            (`cifar_augment`) on image batches ((B, C, H, W) tensors); ignored for other inputs.
        crop_padding: the translation range in pixels (4 = the usual CIFAR RandomCrop(32,
            padding=4); 0 = flips only).
        amp: None (the parameters' dtype) or "bf16": forward passes under
            `torch.autocast(dtype=torch.bfloat16)` (``amp_scope`` of entangle_ext/unlearn/precision.py),
            the loss in float32 from the bfloat16 logits, float32 weights and optimizer state. On
            CPU it pays only where ``cpu_has_bf16_matmul()`` (entangle_ext/unlearn/precision.py)
            is True. "auto": "bf16" where the training device has bfloat16 matrix units, else None
            (``resolve_amp``; `entangle_ext.settings.prepare` resolves it before the cache key).
            Only a float32 model is autocast (a float64 / float16 / bfloat16 one trains in its dtype).
        channels_last: "auto" (default), True or False (ours, an engineering choice, as a run
            config's ``channels_last``, entangle_ext/unlearn/memory_format.py): True passes every
            4-D image batch to the model in ``torch.channels_last`` memory format, which oneDNN's
            CPU convolutions run faster (parameters, gradients and optimizer state keep their
            layout; only the convolutions' rounding changes); "auto" is True on a CPU device for
            a model with a `torch.nn.Conv2d` whose logits on two channels-last samples equal those
            on contiguous ones, else False; True raises ValueError for a model that fails on such
            inputs. `entangle_ext.settings.prepare` resolves it before the cache key. Retrain
            (`entangle_ext.methods.retrain.Retrain`) trains under its run's ``channels_last``
            instead: "auto" here follows it, a True / False here sets it where
            ``RetrainConfig.channels_last`` is "auto" and is a ValueError where that is the other bool.
    Raises:
        TypeError: a field of another type than its annotation (``check_fields``: e.g. epochs=2.0,
            augment="no", lr="fast").
        ValueError: an unknown optimizer/schedule, a NaN/Inf float, lr ≤ 0, epochs < 0,
            batch_size < 1, a negative momentum or weight decay, a negative crop_padding, a
            channels_last other than "auto", True or False, an integer beyond torch's int64.
    """
    optimizer: Optimizer = "sgd"
    lr: float = 1e-3
    epochs: int = 30
    batch_size: int = 256
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: Schedule = "cosine"
    augment: bool = False
    crop_padding: int = 4
    amp: Optional[str] = None
    channels_last: ChannelsLast = "auto"

    def __post_init__(self):
        check_fields(self)   # types first (augment="no" was truthy, epochs=2.0 failed mid-training)
        if self.optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError(f"TrainRecipe.optimizer must be 'sgd', 'adam' or 'adamw', got {self.optimizer!r}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"TrainRecipe.schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not self.lr > 0:
            raise ValueError(f"TrainRecipe.lr must be > 0, got {self.lr}")
        if int(self.epochs) != self.epochs or self.epochs < 0:
            raise ValueError(f"TrainRecipe.epochs must be an integer >= 0, got {self.epochs}")
        if int(self.batch_size) != self.batch_size or self.batch_size < 1:
            raise ValueError(f"TrainRecipe.batch_size must be an integer >= 1, got {self.batch_size}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"TrainRecipe.momentum must be {MOMENTUM_RULE}, got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"TrainRecipe.weight_decay must be >= 0, got {self.weight_decay}")
        if int(self.crop_padding) != self.crop_padding or self.crop_padding < 0:
            raise ValueError(f"TrainRecipe.crop_padding must be an integer >= 0, got {self.crop_padding}")
        if self.amp is not None and self.amp not in AMP_CHOICES:
            raise ValueError(f"TrainRecipe.amp must be None or one of {list(AMP_CHOICES)}, got {self.amp!r}")
        if not (isinstance(self.channels_last, bool) or self.channels_last == "auto"):
            raise ValueError(f"TrainRecipe.channels_last must be one of {CHANNELS_LAST_CHOICES}, got "
                             f"{self.channels_last!r}")

    def replace(self, **changes) -> "TrainRecipe":
        """A copy with ``changes`` applied (validated); None values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cifar_augment(x: torch.Tensor, generator: Optional[torch.Generator] = None, padding: int = 4) -> torch.Tensor:
    """Standard CIFAR augmentation on a (B, C, H, W) batch, per sample: random horizontal flip
    and random translation by up to ``padding`` pixels with zero padding (= RandomCrop(H,
    padding=padding); 0 = flips only). Random numbers come from ``generator`` (a CPU generator);
    the result is on ``x.device``."""
    B, C, H, W = x.shape
    flip = torch.rand(B, generator=generator) < 0.5
    x = torch.where(flip.to(x.device).view(B, 1, 1, 1), x.flip(3), x)
    if padding == 0:
        return x
    p = padding
    pad = F.pad(x, (p, p, p, p))
    dx = torch.randint(0, 2 * p + 1, (B,), generator=generator).to(x.device)
    dy = torch.randint(0, 2 * p + 1, (B,), generator=generator).to(x.device)
    rows = (dy.view(B, 1) + torch.arange(H, device=x.device)).view(B, 1, H, 1).expand(B, C, H, W + 2 * p)
    pad = pad.gather(2, rows)
    cols = (dx.view(B, 1) + torch.arange(W, device=x.device)).view(B, 1, 1, W).expand(B, C, H, W)
    return pad.gather(3, cols)


def _optimizer(model: torch.nn.Module, r: TrainRecipe) -> torch.optim.Optimizer:
    """The recipe's optimizer; float16/bfloat16 parameters are stepped through float32 master
    copies (`master_weight_optimizer`)."""
    params = list(model.parameters())
    if r.optimizer == "sgd":
        return master_weight_optimizer(torch.optim.SGD, params, lr=r.lr, momentum=r.momentum,
                                       weight_decay=r.weight_decay)
    cls = torch.optim.Adam if r.optimizer == "adam" else torch.optim.AdamW
    return master_weight_optimizer(cls, params, lr=r.lr, weight_decay=r.weight_decay)


def _state_dict_of(obj, path: Path) -> dict:
    """The state dict in a loaded file: a plain state dict, or the ``"model"`` entry of an
    `entangle_ext.unlearn` checkpoint."""
    if isinstance(obj, dict) and "model" in ((obj.get("sharded") or {}).get("names") or []):
        raise ValueError(f"{path} is a checkpoint of a sharded (FSDP) run: its model is in "
                         f"{obj['sharded']['path']} (torch.distributed.checkpoint), not in the file")
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} holds no model state dict (a dict of tensors, or a checkpoint with a "
                         "'model' entry)")
    return unwrapped_state(obj)   # a compiled model's own state_dict(): without its "_orig_mod." prefix


def load_model_file(model: torch.nn.Module, path: Union[str, Path], *, device=None) -> torch.nn.Module:
    """Load the weights in ``path`` into ``model`` (strict: same parameter and buffer names and
    shapes), checked before anything is copied. Files are read with ``weights_only=True`` (no code
    from the file runs; the numpy arrays of a checkpoint's RNG state are allowed), by the reader
    ``--resume`` uses (``from entangle_ext.unlearn import load_checkpoint``).

    Args:
        model: the module to fill (its own architecture decides what fits); a ``torch.compile``
            model is filled through the module underneath, so files of plain and compiled models
            load into either.
        path: one of (a leading ``~`` is the home directory)
            * a file written by ``torch.save(model.state_dict())`` (e.g. a cached original model);
            * a checkpoint of `entangle_ext.unlearn` or a baseline run through it (e.g.
              ``OUT/checkpoints/stage1_done.pt``, ``stage2_done.pt``, ``done.pt`` or a mid-stage
              one): its ``"model"`` entry;
            * the pointer ``OUT/checkpoints/latest.pt`` (followed), or the out dir ``OUT`` (or its
              ``checkpoints/``) itself: the latest checkpoint of that run.
        device: where the tensors are mapped (default: the model's device).
    Returns:
        ``model``.
    Raises:
        FileNotFoundError: no such file, no checkpoint under the directory.
        ValueError: not a readable torch file (one line: "<path> is not a readable torch file
            (state dict or entangle_ext checkpoint): <short reason>"; a damaged file, whose record
            CRC-32s do not match, is refused before ``model`` is touched), a file holding no state dict,
            or one that does not fit ``model``; the message lists the missing, unexpected and
            differently shaped entries, so a file made for another setting, data selection or model
            says so.
    """
    path = expand_user(path)   # "~/m.pt": the home directory
    if not Path(path).exists():
        raise FileNotFoundError(f"model file {path} not found")
    if device is None:
        device = next(iter(model.parameters()), torch.empty(0)).device
    found, obj = open_checkpoint(path, map_location=device)
    sd = _state_dict_of(obj, found)
    want = state_module(model).state_dict()
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    shapes = [f"{k}: file {tuple(sd[k].shape)} vs model {tuple(v.shape)}" for k, v in want.items()
              if k in sd and sd[k].shape != v.shape]
    if missing or unexpected or shapes:
        parts = [f"{what} {items[:4]}{' ...' if len(items) > 4 else ''}" for what, items in
                 (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)) if items]
        raise ValueError(f"{found} does not fit this model ({type(model).__name__}): " + "; ".join(parts)
                         + ". It was made for another model, setting or data selection.")
    state_module(model).load_state_dict(sd)
    return model


@training_grad_mode()
def train_original(model: torch.nn.Module, datasets: Sequence[Dataset], recipe: TrainRecipe = TrainRecipe(), *,
                   device=None, seed: int = 0, cache: Optional[Union[str, Path]] = None,
                   progress: bool = True) -> torch.nn.Module:
    """Train ``model`` (in train mode) on the union of ``datasets`` following ``recipe``, or load
    ``cache`` (a state-dict file, `load_model_file`; a leading ``~`` is the home directory) when
    it exists; the trained weights are
    written to ``cache``. The caller keys ``cache`` on everything that produced the model
    (`entangle_ext.settings.prepare` does).

    Args:
        model: any module returning (B, C) logits (or HF-style ``.logits``); moved to ``device``.
        datasets: (x, y) or dict (``"labels"`` + model inputs) datasets, DataLoaders over them
            or `Source` s (e.g. ``splits.source("adjacent")``, which keeps the splits' collate
            function), batched together as `union_source` does; labels are integer class
            indices (any integer dtype), floating inputs are cast to the model's dtype.
        recipe: `TrainRecipe`. seed: seeds python/numpy/torch (dropout) and the data-order and
            augmentation generator. device: default = the model's device.
        progress: tqdm bar per step (loss shown once per epoch).
    Returns:
        ``model`` in eval mode on ``device``.
    Raises:
        ValueError: ``datasets`` empty or holding no sample; labels that are not integer class
            indices; no ``device`` for a model without parameters or buffers; a ``cache`` file
            that does not fit ``model`` (see `load_model_file`); a ``cache`` whose folder exists
            as a file or cannot be created or written (`make_out_dir`, checked before training).
            TypeError: a ``cache`` that is not a str or os.PathLike.
    Warns:
        CacheNotWrittenWarning: the trained weights could not be written to ``cache`` (disk
            full, a file-size limit, permissions: the `WriteError`'s message); the trained model
            is returned all the same, and the next call trains it again.
    """
    check_out_dir_type(cache, "cache")
    cache = expand_user(cache)   # "~/cache/m.pt": the home directory
    device = model_device(model, device)
    model.to(device)
    if cache is not None and Path(cache).exists():
        return load_model_file(model, cache, device=device).eval()
    if cache is not None:   # before the training: a folder that cannot be made fails now, not after it
        make_out_dir(Path(cache).parent, "the folder of the cache file")
    fit(model, datasets, recipe, device=device, seed=seed, progress=progress)
    if cache is not None:
        state = state_module(model).state_dict()   # of a compiled model: its module's (no "_orig_mod.")
        try:
            atomic_write(cache, lambda tmp: torch.save(state, tmp), what="original-model cache",
                         hint="the trained model is returned but not cached (the next run trains it "
                              "again): free space or raise the file-size limit")
        except WriteError as e:   # the training is not lost to a full disk: warn and go on
            warnings.warn(str(e), CacheNotWrittenWarning, stacklevel=2)
    return model


class CacheNotWrittenWarning(UserWarning):
    """`train_original` trained the model but could not write it to its cache file."""


@training_grad_mode()
def fit(model: torch.nn.Module, datasets: Sequence[Dataset], recipe: TrainRecipe, *, device, seed: int = 0,
        progress: bool = True, desc: str = "original model") -> int:
    """The training of `train_original` without its cache: ``model`` (already on ``device``) trained
    on the union of ``datasets`` following ``recipe``, then left in eval mode. Returns the number
    of optimizer steps taken (``recipe.epochs`` × the batches of an epoch; `entangle_ext.unlearn`'s
    Retrain reports it). ``desc``: the progress bar's label (Retrain: "retrain (from scratch)").
    Raises ValueError as `train_original`."""
    from ._progress import progress_bar

    data = union_source(datasets) if datasets else None
    if data is None or len(data.dataset) == 0:
        raise ValueError("train_original needs at least one non-empty dataset")
    seed_everything(seed)
    stream = BatchStream(data, recipe.batch_size, shuffle=False, seed=seed, name="train/original", device=device,
                         input_dtype=model_dtype(model), training=True, fold_tail=has_batchnorm(model))
    gen = torch.Generator().manual_seed(seed)
    opt = _optimizer(model, recipe)
    steps = len(stream)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(recipe.epochs * steps, 1)) \
        if recipe.schedule == "cosine" else None
    bar = progress_bar(total=recipe.epochs * steps, desc=desc, enabled=progress)
    with amp_scope(resolve_amp(recipe.amp, device, model_dtype(model))):   # a float32 model only
        channels_last = False
        if recipe.channels_last is not False:   # the memory-format probe: two samples, no gradient, no
            with preserved_rng():                # buffer update, and no random number drawn for training
                model.eval()
                inputs, _ = split_batch(stream.fetch(torch.arange(min(2, stream.n))))
                channels_last = resolve_channels_last(recipe.channels_last, model, inputs, device)
        model.train()
        with channels_last_scope(channels_last):
            taken = _train_epochs(model, stream, recipe, opt, sched, gen, bar)
    bar.close()
    model.eval()
    return taken


def _train_epochs(model, stream, recipe: TrainRecipe, opt, sched, gen, bar) -> int:
    """The epochs of `train_original` (inside its `amp_scope`); returns the optimizer steps taken."""
    taken = 0
    for e in range(recipe.epochs):
        for idx in stream.split(torch.randperm(stream.n, generator=gen)):   # no 1-sample batch
            inputs, y = split_batch(stream.fetch(idx))
            if recipe.augment and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
                inputs = cifar_augment(inputs, gen, recipe.crop_padding)
            loss = F.cross_entropy(loss_logits(model, inputs), y)   # float32 for bf16/half logits
            opt.zero_grad(set_to_none=True)
            require_graph(loss).backward()
            opt.step()
            if sched is not None:
                sched.step()
            bar.update(1)
            taken += 1
        bar.set_postfix(loss=f"{loss.item():.3f}", epoch=e + 1, refresh=False)  # one host read per epoch
    return taken
