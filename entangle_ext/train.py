"""Training of the *original* model θ0 (before unlearning), as described in method.md
("Original models: CIFAR ResNet-18 from scratch, SGD 1e-3 momentum 0.9 wd 5e-4, cosine, 30 epochs,
batch 256"), with an on-disk cache."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .unlearn.data import BatchStream, forward_logits, split_batch
from .unlearn.driver import seed_everything

__all__ = ["train_original", "cifar_augment"]


def cifar_augment(x: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Standard CIFAR augmentation on a (B, 3, H, W) batch, per sample: random horizontal flip
    and random translation by up to 4 pixels with zero padding (= RandomCrop(32, padding=4))."""
    B, _, H, W = x.shape
    flip = torch.rand(B, generator=generator) < 0.5
    x = torch.where(flip.to(x.device).view(B, 1, 1, 1), x.flip(3), x)
    pad = F.pad(x, (4, 4, 4, 4))
    dx = torch.randint(0, 9, (B,), generator=generator).to(x.device)
    dy = torch.randint(0, 9, (B,), generator=generator).to(x.device)
    rows = (dy.view(B, 1) + torch.arange(H, device=x.device)).view(B, 1, H, 1).expand(B, x.shape[1], H, W + 8)
    pad = pad.gather(2, rows)
    cols = (dx.view(B, 1) + torch.arange(W, device=x.device)).view(B, 1, 1, W).expand(B, x.shape[1], H, W)
    return pad.gather(3, cols)


def train_original(model: torch.nn.Module, datasets: Sequence[Dataset], *, epochs: int = 30,
                   lr: float = 1e-3, momentum: float = 0.9, weight_decay: float = 5e-4,
                   batch_size: int = 256, cosine: bool = True, augment: bool = False,
                   device=None, seed: int = 0, cache: Optional[Union[str, Path]] = None,
                   progress: bool = True, optimizer: str = "sgd") -> torch.nn.Module:
    """Train ``model`` (train mode, SGD + momentum + weight decay, cosine LR over all steps) on the
    union of ``datasets`` ((x, y) or dict batches), or load ``cache`` when it exists (and write it
    afterwards). ``optimizer="adamw"`` uses AdamW (lr, weight_decay; momentum ignored) instead, for
    the ViT / transformer settings. Returns the model in eval mode on ``device``."""
    if optimizer not in ("sgd", "adamw"):
        raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}")
    from tqdm.auto import tqdm

    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    if cache is not None and Path(cache).exists():
        model.load_state_dict(torch.load(cache, map_location=device))
        return model.eval()
    seed_everything(seed)
    data = torch.utils.data.ConcatDataset(list(datasets))
    if all(getattr(d, "tensors", None) is not None for d in datasets):
        data = torch.utils.data.TensorDataset(*[torch.cat([d.tensors[i] for d in datasets])
                                                for i in range(len(datasets[0].tensors))])
    stream = BatchStream(data, batch_size, shuffle=True, seed=seed, name="train", device=device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay) \
        if optimizer == "sgd" else torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    total = epochs * len(stream)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total, 1)) if cosine else None
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(total=total, desc="original model", disable=not progress, dynamic_ncols=True)
    model.train()
    for e in range(epochs):
        for b in stream.epoch_batches(e):
            inputs, y = split_batch(b)
            if augment and isinstance(inputs, torch.Tensor):
                inputs = cifar_augment(inputs, gen)
            loss = F.cross_entropy(forward_logits(model, inputs), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", epoch=e + 1)  # one host read per epoch
    bar.close()
    model.eval()
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), cache)
    return model
