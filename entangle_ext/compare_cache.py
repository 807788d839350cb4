"""The per-run cache of `entangle_ext.compare`: ``out_dir/cache/<method>/seed<k>.json``, one
record per finished (method, seed) run, keyed (`cache_key`) on `CACHE_FORMAT`, the method, the
seed, its effective hyperparameters (an ``amp`` of "auto" as what it runs as on the comparison's
device, `resolved_amp_fields`), the fingerprint of the original model and the splits
(``entangle_ext/unlearn/fingerprint.py``) and the metric settings; not on Retrain's record (the gap
metrics to Retrain are not in the records: `compare` adds them when it assembles the table).
A record made with another torch version or device type is reused with a `UserWarning`; a record
of an older cache format is recomputed, with a one-line notice per cache directory."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import torch

from .unlearn.files import atomic_write
from .unlearn.metrics import gap_metrics
from .unlearn.precision import resolve_amp

__all__ = ["CACHE_FORMAT", "ResultCache", "record_metrics", "cache_key", "cache_env", "cached_note", "jsonable", "json_nan_free",
           "resolved_amp_fields"]

CACHE_FORMAT = 5
"""Part of every cache key and written into every record: 2 since an MIA attack without signal
scores NaN (undefined) instead of 0 or 100 % (records of format 1 hold coin-flip MIA values); 3
since the one fingerprint of the splits and the model (``entangle_ext/unlearn/fingerprint.py``); 4
since a record holds the KS statistic of the forget losses ("forget_ks", beside the p-value) and
relearn time counts steps of the geometric lr schedule (1e-5 × 1.1^k; format 3: a constant 1e-3,
one step for almost every model) — a format-3 record lacks the one and holds the other's old,
unresolved count; 5 since a record holds its forget losses and no gap metrics ("avg_gap",
"forget_quality", "forget_ks", added from the records when the table is assembled) and its key no
longer holds its seed's Retrain key (so a changed Retrain no longer recomputes every other run, and
no run waits for Retrain). Records of an older format are recomputed, not reused."""


def json_nan_free(obj) -> Any:
    """``obj`` with every NaN / ±Inf float (an undefined metric, e.g. MIA-efficacy without signal)
    replaced by None: JSON has no NaN (``json.dumps(..., allow_nan=False)`` then holds)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: json_nan_free(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_nan_free(v) for v in obj]
    return obj


def jsonable(obj) -> Any:
    """``obj`` as JSON-ready builtins for a cache key or a record: ``to_dict()`` / dataclass fields,
    mappings with string keys in sorted order, lists for tuples, ``repr`` for anything else."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return repr(obj)


class ResultCache:
    """``out_dir/cache/<method>/seed<k>.json``, written atomically; None dir = no cache."""

    _noticed: set = set()   # the cache roots whose old-format records were announced (one line each)

    def __init__(self, out_dir, device=None):
        self.root = None if out_dir is None else Path(out_dir) / "cache"
        self.device = device

    def path(self, method: str, seed: int) -> Optional[Path]:
        return None if self.root is None else self.root / re.sub(r"[^A-Za-z0-9_.-]", "_", method) / f"seed{seed}.json"

    def load(self, method: str, seed: int, key: str) -> Optional[dict]:
        p = self.path(method, seed)
        if p is None or not p.exists():
            return None
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            return None   # unreadable: run again
        if rec.get("format", 1) < CACHE_FORMAT:
            self._notice_old_format(rec.get("format", 1))
            return None
        if rec.get("key") != key:
            return None
        for k in rec.get("nan_metrics", ()):   # stored as null (JSON has no NaN): back to NaN
            rec["metrics"][k] = math.nan
        env, here = rec.get("env"), cache_env(self.device)
        if env is not None and env != here:
            warnings.warn(f"compare: reusing the cached {method} seed {seed} made with torch {env.get('torch')} "
                          f"on {env.get('device')} (this run: torch {here['torch']} on {here['device']}); "
                          f"delete {p} to recompute it", UserWarning, stacklevel=3)
        return rec

    def _notice_old_format(self, old: int) -> None:
        if self.root in ResultCache._noticed:
            return
        ResultCache._noticed.add(self.root)
        print(f"compare: the cache under {self.root} holds records of an older format ({old}, now "
              f"{CACHE_FORMAT}): recomputing them", file=sys.stderr)

    def save(self, method: str, seed: int, rec: dict) -> None:
        p = self.path(method, seed)
        if p is None:
            return
        nan = sorted(k for k, v in rec.get("metrics", {}).items() if isinstance(v, float) and math.isnan(v))
        text = json.dumps(json_nan_free({**rec, **({"nan_metrics": nan} if nan else {}), "format": CACHE_FORMAT,
                                         "env": cache_env(self.device)}),
                          allow_nan=False)   # (one temporary file per process: --jobs workers share the dir)
        atomic_write(p, lambda tmp: tmp.write_text(text), what="comparison cache entry", parents=True,
                     hint="the runs cached so far are kept: free space and rerun the same command to go on")


def cached_note(reused: Mapping[str, Sequence[int]], root: Optional[Path]) -> str:
    """The line under the table naming the results reused from the cache, e.g. "cached: ft seeds
    0,1 (from OUT/cache; delete to recompute)"."""
    parts = "; ".join(f"{m} seed{'s' if len(k) > 1 else ''} {','.join(str(i) for i in k)}" for m, k in reused.items())
    return f"cached: {parts} (from {root}; delete to recompute)"


def cache_env(device) -> Dict[str, str]:
    """What a cached record notes about where it was computed (not part of its key)."""
    return {"torch": torch.__version__, "device": "cpu" if device is None else torch.device(device).type}


def resolved_amp_fields(obj, device, dtype: Optional[torch.dtype] = torch.float32) -> Any:
    """``obj`` (a method's JSON-ready hyperparameters, e.g. a `MethodSpec`'s ``hparams``) with
    every ``"amp": "auto"`` entry, at any depth, replaced by what ``"auto"`` runs as on ``device``
    for a model of ``dtype`` (`resolve_amp` of entangle_ext/unlearn/precision.py: "bf16" or None).
    The cache key holds this, not "auto": a record made under bfloat16 autocast on a CPU with
    bfloat16 matrix units is never reused on a machine where "auto" runs float32, and the other
    way round. Other values are kept; ``obj`` itself is not modified."""
    if isinstance(obj, Mapping):
        return {k: (resolve_amp(v, device, dtype) if k == "amp" and v == "auto" else
                    resolved_amp_fields(v, device, dtype)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolved_amp_fields(v, device, dtype) for v in obj]
    return obj


def cache_key(*parts) -> str:
    return hashlib.sha256(json.dumps(jsonable(parts), sort_keys=True).encode()).hexdigest()


_AFTER_GAPS = ("relearn_steps", "relearn_reached", "time_s")   # the keys the gap metrics come before


def record_metrics(metrics: Mapping[str, Any], ref: Optional[Mapping[str, Any]]) -> dict:
    """A cached record's metrics for the table: without its "forget_losses", and with the gap
    metrics to its seed's Retrain (`gap_metrics`; ``ref`` = Retrain's metrics, None for Retrain
    itself, a seed whose Retrain failed or was not compared; a failed run's empty metrics stay
    empty), in the place `unlearning_metrics` gives them (so the same dict as one
    `unlearning_metrics(..., retrained=ref)` call). Raises as `gap_metrics`."""
    kept = {k: v for k, v in metrics.items() if k != "forget_losses"}
    if ref is None or not kept:
        return kept
    gaps = gap_metrics(kept, metrics["forget_losses"], ref)
    head = {k: v for k, v in kept.items() if k not in _AFTER_GAPS}
    return {**head, **gaps, **{k: kept[k] for k in _AFTER_GAPS if k in kept}}
