"""The fingerprints that stop a resume or a cached result from mixing different data or models.

One home for them (before, `checkpoint.splits_fingerprint`, `report.split_fingerprint` and
`compare.fingerprint` each hashed a `Splits` their own way, from tensors only for a
`TensorDataset` and from a few items, the length or the type for other Datasets):

* `splits_fingerprint`: every item of every present split, read as the collated batches of one
  unshuffled pass (the package's `BatchStream`: Datasets, DataLoaders, dict items, custom collate
  functions), labels as int64 (their dtype does not matter), other tensors by dtype, trailing shape
  and bytes, non-tensor leaves by ``repr``.
* `model_fingerprint`: the model's class (module and qualname), its state dict, and its outputs on
  a few seeded inputs shaped like a batch of the forget split (so a changed ``forward`` with the
  same weights is seen); of a compiled model, the module's under it.
* `fingerprint`: both, as one 16-hex-digit key (the comparison cache).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any, Dict, Iterator, Optional

import torch

from .data import BatchStream, forward_logits, split_batch
from .distributed import SINGLE
from .module_state import state_module
from .nest import map_tensors

__all__ = ["splits_fingerprint", "model_fingerprint", "original_state", "fingerprint", "FINGERPRINT_VERSION",
           "FINGERPRINT_BATCH", "one_thread"]

#: 2: every item of every split (1, implicit: labels and a sample of the inputs, or less)
FINGERPRINT_VERSION = 2
#: samples per batch of the hashing pass (the hash does not depend on it for fixed-shape items)
FINGERPRINT_BATCH = 512


def _update_tensor(h, t: torch.Tensor, trailing: bool = True) -> None:
    t = t.detach()
    shape = tuple(t.shape[1:]) if trailing and t.dim() else tuple(t.shape)
    h.update(f"T{t.dtype}{shape};".encode())
    t = t.to("cpu").contiguous()
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _update_leaves(h, obj) -> None:
    """Feed a batch (tensors, dicts, tuples / lists, other leaves by repr) into ``h``."""
    if isinstance(obj, torch.Tensor):
        _update_tensor(h, obj)
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(f"{k!r}:".encode())
            _update_leaves(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (tuple, list)):
        h.update(b"(")
        for v in obj:
            _update_leaves(h, v)
        h.update(b")")
    else:
        h.update(f"R{obj!r};".encode())


def _split_hash(data, name: str) -> Dict[str, Any]:
    stream = BatchStream(data, FINGERPRINT_BATCH, shuffle=False, seed=0, name=name, device="cpu",
                         dist=SINGLE)   # every rank hashes every item
    h = hashlib.sha256(f"v{FINGERPRINT_VERSION}:{name}:{stream.n}:".encode())
    for batch in stream.epoch_batches(0):   # prepared: labels int64, inputs as given
        _update_leaves(h, batch)
    stream.close()
    return {"n": stream.n, "hash": h.hexdigest()[:16]}


@torch.no_grad()
def splits_fingerprint(splits) -> Dict[str, Dict[str, Any]]:
    """{split name: {"n": samples, "hash": 16 hex digits}} of every present split of a `Splits`
    (train splits, then held-out), hashing every item (see the module docstring): one unshuffled
    pass over each split, on the CPU, with the split's collate function and loader options."""
    return {name: _split_hash(splits.source(name), name) for name in splits.named()}


def _probe_inputs(model: torch.nn.Module, splits, rows: int, seed: int):
    """Inputs shaped like the first ``rows`` items of the forget split (the first present split
    when there is none), on the model's device: floating tensors replaced by seeded normal draws
    (a private generator: the global RNG is not touched), other leaves kept."""
    name = "forget" if getattr(splits, "forget", None) is not None else next(iter(splits.named()))
    src = splits.source(name)
    stream = BatchStream(src, rows, shuffle=False, seed=0, name=name, device="cpu", dist=SINGLE)
    batch = stream.fetch(torch.arange(min(rows, stream.n)))
    inputs, _ = split_batch(batch)
    g = torch.Generator().manual_seed(seed)
    state = list(model.parameters()) + list(model.buffers())
    dev = next((t.device for t in state), torch.device("cpu"))
    dtype = next((t.dtype for t in state if t.is_floating_point()), None)   # as the stages cast them

    def fill(x: torch.Tensor) -> torch.Tensor:
        x = torch.randn(x.shape, generator=g).to(dtype or x.dtype) if x.is_floating_point() else x
        return x.to(dev)
    return map_tensors(fill, inputs)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one CPU thread for the body (the caller's count is restored, also on error). A
    float32 CPU kernel's result can change in the last bits with the thread count (it splits its
    sums otherwise), so a value that goes into a key (`model_fingerprint`'s outputs, the relearn
    threshold of `entangle_ext.compare`) is computed on one thread: the ``compare --jobs N``
    workers (``threads // N`` threads each) and their parent then compute the same keys."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def model_fingerprint(model: torch.nn.Module, splits=None, *, rows: int = 4, seed: int = 0) -> Dict[str, str]:
    """{"class": module.qualname, "state": 16 hex digits of the state dict (names, dtypes, shapes,
    bytes), "outputs": 16 hex digits of the model's logits (rounded to 6 significant digits) on
    ``rows`` seeded inputs shaped like a batch of ``splits``' forget split}. Without ``splits``
    there is no "outputs". The forward runs in eval mode without gradients, on one CPU thread
    (`one_thread`: on two threads the Tiny-ImageNet ``lite0`` model's outputs differed from one
    thread's in a 6th digit, so the ``compare --jobs 2`` parent missed every record its
    one-thread workers had cached and ran the whole comparison again); the modules' train/eval
    flags are restored. The rounding hides most round-off of another CPU's kernels, not all of it: a
    logit that lies at a rounding boundary gives another digit, and then another fingerprint. A compiled model
    (``torch.compile``) is fingerprinted by the module underneath (`state_module`: class, state
    and outputs), so it and the plain model with the same weights fingerprint the same."""
    model = state_module(model)
    cls = type(model)
    out = {"class": f"{cls.__module__}.{cls.__qualname__}"}
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(f"{k}:".encode())
        if isinstance(v, torch.Tensor):
            _update_tensor(h, v, trailing=False)
        else:
            h.update(repr(v).encode())
    out["state"] = h.hexdigest()[:16]
    if splits is not None:
        flags = [(m, m.training) for m in model.modules()]
        with one_thread():   # the digits must not depend on the caller's thread count (see the docstring)
            try:
                model.eval()
                with torch.no_grad():
                    logits = forward_logits(model, _probe_inputs(model, splits, rows, seed))
            finally:
                for m, t in flags:
                    m.training = t
        vals = logits.detach().float().cpu().reshape(-1).tolist()
        text = json.dumps([tuple(logits.shape)] + [f"{v:.6g}" for v in vals])
        out["outputs"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def original_state(model: torch.nn.Module) -> Optional[str]:
    """The "state" of `model_fingerprint` of ``model`` (of the module under a DDP wrapper), which a
    run keeps in its checkpoints as ``done["original_state"]`` for θ0 (the CLI's ``--resume`` then
    refuses an original model other than the one the run started from); None for a model with
    sharded (DTensor) tensors, whose bytes are spread over the ranks."""
    from .distributed import unwrap
    model = unwrap(model)
    if any(type(t).__name__ == "DTensor" for t in model.state_dict().values()):
        return None
    return model_fingerprint(model)["state"]


def fingerprint(model: torch.nn.Module, splits, splits_fp: Optional[Dict[str, Any]] = None) -> str:
    """16 hex digits of (`model_fingerprint` of ``model`` on ``splits``, `splits_fingerprint` of
    ``splits``; pass ``splits_fp`` when it is already computed)."""
    fp = splits_fingerprint(splits) if splits_fp is None else splits_fp
    text = json.dumps({"model": model_fingerprint(model, splits), "splits": fp}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
