"""The operators' wrappers' refusal of sparse (non-strided) tensors, shared by every wrapper."""
from __future__ import annotations

import torch


def check_dense(op: str, name: str, t: torch.Tensor) -> None:
    """TypeError for a sparse (or other non-strided) tensor ``t``: the kernels read dense memory,
    and the dispatcher's own errors ("Cannot access data pointer of Tensor that doesn't have
    storage", "unsupported memory format option") do not say what to do."""
    if t.layout != torch.strided:
        raise TypeError(f"{op}: {name} is a {str(t.layout).replace('torch.', '')} tensor; the entangle_ext "
                        f"operators take dense (strided) tensors: pass {name}.to_dense()")
