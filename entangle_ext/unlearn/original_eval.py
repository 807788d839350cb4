"""One evaluation of the original model θ0 for the runs of one comparison.

Every run evaluates θ0 on every split before its first step (``report["evals"]["original"]``,
and c0 = its mean remote cross-entropy, the Stage-1 constraint target). In a comparison every run
starts from a copy of the same θ0, so with the same evaluation settings that pass gives the same
result every time (on the Tiny-ImageNet ``lite0`` setting it was ~50 s of one thread per run).
Inside `original_eval_scope` (which `entangle_ext.compare` and its ``--jobs`` workers open) the
first such evaluation is kept and later runs take a copy of it instead of evaluating again.

A kept evaluation is reused only when everything it depends on is the same (`evaluation_key`):
θ0 itself (`model_fingerprint`: class, state dict, outputs on seeded inputs), the splits
(`splits_fingerprint`), the device, the autocast precision, the memory format, the evaluation
batch size, the number of classes, the torch thread count, and the state of the global random
generators when the evaluation starts. The last one matters because evaluating a Dataset split
through a DataLoader draws its base seed from torch's global generator: a reused evaluation sets
the generators to the state the kept evaluation left them in, so the run that follows draws
exactly the numbers it would have drawn after evaluating (its result is bit-identical; runs of one
seed start from the same state, runs of another seed evaluate anew). No reuse in a distributed
run (its ranks evaluate together) or outside the scope.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import json
import time
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np
import torch

from .checkpoint import rng_state, set_rng_state
from .scopes import joined_scope

__all__ = ["original_eval_scope", "evaluation_key", "rng_digest", "reuse_or_evaluate", "evaluate_original"]

#: {key: {"evals": ..., "rng": state after the evaluation}} of the open scope; None outside one.
_KEPT: contextvars.ContextVar[Optional[Dict[str, Dict[str, Any]]]] = contextvars.ContextVar(
    "entangle_ext_original_evals", default=None)


@contextlib.contextmanager
def original_eval_scope() -> Iterator[None]:
    """Within this context the evaluations of θ0 that runs make are kept and reused (see the module
    docstring). A scope opened inside another joins it (``compare`` inside a ``--jobs`` worker's
    scope keeps what the worker's earlier tasks evaluated)."""
    with joined_scope(_KEPT, dict):
        yield


def rng_digest() -> str:
    """16 hex digits of the python, numpy and torch (CPU, and every CUDA device when available)
    generator states (`rng_state`)."""
    h = hashlib.sha256()
    s = rng_state()
    h.update(s["torch"].numpy().tobytes())
    kind, keys, pos, has_gauss, cached = s["numpy"]
    h.update(f"{kind}:{pos}:{has_gauss}:{cached!r}:".encode())
    h.update(np.asarray(keys).tobytes())
    h.update(repr(s["python"]).encode())
    for t in s.get("cuda", ()):
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def evaluation_key(model: torch.nn.Module, splits, splits_fp: Dict[str, Any], **settings: Any) -> str:
    """16 hex digits of what an evaluation of ``model`` on ``splits`` depends on: the model's
    `model_fingerprint`, ``splits_fp`` (its `splits_fingerprint`), ``settings`` (device, amp,
    memory format, batch size, classes, ...: JSON-able values or their ``str``), the torch thread
    count and `rng_digest`."""
    from .fingerprint import model_fingerprint
    text = json.dumps({"model": model_fingerprint(model, splits), "splits": splits_fp,
                       "settings": {k: str(v) for k, v in sorted(settings.items())},
                       "threads": torch.get_num_threads(), "rng": rng_digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reuse_or_evaluate(key_fn: Callable[[], str], evaluate_fn: Callable[[], Dict[str, dict]]) -> tuple:
    """(evaluations, reused): ``evaluate_fn()``, kept under ``key_fn()`` when a scope is open; or,
    when the open scope holds that key, a deep copy of the kept evaluations with the global
    generators set to the state the kept evaluation left them in. Outside a scope ``key_fn`` is
    not called."""
    kept = _KEPT.get()
    if kept is None:
        return evaluate_fn(), False
    key = key_fn()
    if key in kept:
        set_rng_state(copy.deepcopy(kept[key]["rng"]))
        return copy.deepcopy(kept[key]["evals"]), True
    evals = evaluate_fn()
    kept[key] = {"evals": copy.deepcopy(evals), "rng": copy.deepcopy(rng_state())}
    return evals, False


def evaluate_original(run) -> None:
    """``run.evaluate("original", check_finite=True)`` (θ0 under ``run.evals["original"]``), or,
    inside an `original_eval_scope` that already evaluated the same θ0 with the same settings and
    generator state, a copy of that evaluation (`reuse_or_evaluate`: the generators are left as
    the evaluation would leave them; ``run.timings["eval_original"]`` is the copy's time). Not
    reused in a distributed run (its ranks evaluate together)."""
    from .distributed import current
    if current().active:
        run.evaluate("original", check_finite=True)
        return

    def key() -> str:
        return evaluation_key(run.model, run.splits, run.fingerprint, device=run.device, amp=run.amp,
                              channels_last=run.channels_last, batch_size=run.config.eval_batch_size,
                              num_classes=run.num_classes, check_finite=True)

    def fresh() -> Dict[str, dict]:
        run.evaluate("original", check_finite=True)
        return run.evals["original"]
    start = time.perf_counter()
    evals, reused = reuse_or_evaluate(key, fresh)
    if reused:
        run.evals["original"] = evals
        run.timings["eval_original"] = time.perf_counter() - start
