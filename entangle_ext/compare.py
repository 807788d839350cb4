"""`compare`: several unlearning methods from one original model, over seeds, in one table.

    result = entangle_ext.compare(model, splits, methods=["retrain", "two_stage", "salun"],
                                  seeds=[0, 1, 2], setting="digits", out_dir="runs/compare",
                                  model_fn=build_fresh_model, retrain_recipe=recipe)
    print(result.table)

Every (method, seed) run starts from a deep copy of ``model`` and is scored by
`entangle_ext.unlearn.metrics.unlearning_metrics` (docs/algorithm.md §10); the retrained model of the
same seed is the reference of the gap metrics. The first row, "original", is ``model`` itself.
Outputs under ``out_dir``: ``comparison.md`` (mean ± std over seeds, rows = methods, columns = metrics
with their direction, best per column in bold), ``comparison.json`` and ``comparison.png``, and
``cache/<method>/seed<k>.json``: one file per finished run, keyed on the method, the seed, its
hyperparameters and a fingerprint of the splits and the original model, so a rerun after an
interruption (or with more methods / seeds) only runs what is missing.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .unlearn import Splits, UnlearnConfig, UnlearnResult, evaluate
from .unlearn.checkpoint import preserved_rng, seed_everything
from .compare_report import TABLE_COLUMNS, format_markdown, plot_comparison, summarize
from .unlearn.metrics import METRICS, unlearning_metrics

__all__ = ["compare", "ComparisonResult", "MethodSpec", "method_spec", "available_methods", "fingerprint",
           "summarize", "format_markdown", "plot_comparison", "TABLE_COLUMNS", "DEFAULT_RELEARN"]

TWO_STAGE_FAMILY = ("two_stage", "no_w2", "pgd_mean", "stage1_only")
DEFAULT_RELEARN = {"fraction": 0.9, "subset": 0.1, "lr": 1e-3, "max_steps": 100, "batch_size": 64}
"""Relearn time: threshold = ``fraction`` × the original model's forget-train accuracy; the rest are
`relearn_time` arguments."""
CACHE_FORMAT = 1


@dataclass
class MethodSpec:
    """One method of a comparison.

    Attributes:
        name: row name (and cache directory). run: ``run(model, splits, *, seed, device, progress)``
            returning an object with ``.model`` (the unlearned model) and ``.report`` (dict; its
            ``["evals"]["final"]`` and ``["timings_s"]["unlearn"]`` are used when present).
        hparams: JSON-serialisable hyperparameters; part of the cache key.
    """
    name: str
    run: Callable[..., Any]
    hparams: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ComparisonResult:
    """What `compare` returns.

    Attributes:
        table: markdown table (mean ± std over seeds). summary: {method: {metric: {"mean", "std",
        "n"}}}. runs: {method: {seed: {metric: value}}}. seeds, methods: as run. paths: files
        written ({"markdown", "json", "png"}; empty without ``out_dir``). relearn: relearn settings.
    """
    table: str
    summary: Dict[str, Dict[str, Dict[str, float]]]
    runs: Dict[str, Dict[int, Dict[str, Any]]]
    seeds: List[int]
    methods: List[str]
    paths: Dict[str, str] = field(default_factory=dict)
    relearn: Optional[Dict[str, Any]] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"methods": self.methods, "seeds": self.seeds, "relearn": self.relearn,
                "metrics": {k: dataclasses.asdict(v) for k, v in METRICS.items()},
                "summary": self.summary, "runs": {m: {str(s): r for s, r in v.items()} for m, v in self.runs.items()},
                "table": self.table}


# ------------------------------------------------------------------------------------ methods
def available_methods() -> List[str]:
    """Names `compare` can run: the registry of `entangle_ext.methods` when installed, else the
    two-stage method only."""
    try:
        from .methods import available_methods as names
    except ModuleNotFoundError as e:
        if e.name not in ("entangle_ext.methods", __package__ + ".methods"):
            raise
        return ["two_stage"]
    return list(names())


def _jsonable(obj) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return repr(obj)


def _call_unlearn(name: str, model, splits, config, *, seed, device, progress, retrain_recipe=None, **kw):
    """`entangle_ext.unlearn(..., method=name)`, passing only the keywords its signature takes."""
    from .unlearn import unlearn
    params = inspect.signature(unlearn).parameters
    if "method" not in params:   # entangle_ext.methods not installed: the two-stage method only
        return unlearn(model, splits, config, device=device, progress=progress)
    recipe_kw = next((k for k in ("retrain_recipe", "recipe", "train_recipe") if k in params), None)
    kw = {**kw, "method": name, "seed": seed, "device": device, "progress": progress,
          **({recipe_kw: retrain_recipe} if recipe_kw else {})}
    return unlearn(model, splits, config, **{k: v for k, v in kw.items() if k in params and v is not None})


def method_spec(name: str, *, setting: Optional[str] = None, variant: Optional[str] = None,
                hparams: str = "paper_code", config=None, model_fn=None, retrain_recipe=None,
                **method_kwargs) -> MethodSpec:
    """The `MethodSpec` of a registered method, run through ``entangle_ext.unlearn(method=name)``.

    The two-stage family (two_stage, no_w2, pgd_mean, stage1_only) runs ``config`` (an
    `UnlearnConfig`), else the preset of ``setting`` / ``variant`` (`entangle_ext.settings`), else
    ``UnlearnConfig()``, with ``seed`` set per run; a baseline runs its ``config`` or the
    ``hparams`` preset of ``setting`` (docs/algorithm.md §10). ``model_fn`` / ``retrain_recipe``
    build and train the model of "retrain". Raises ValueError for an unknown name.
    """
    names = available_methods()
    if name not in names:
        raise ValueError(f"unknown method {name!r}; available here: {names}")

    def make_config(seed: int):
        if name not in TWO_STAGE_FAMILY:
            return config
        if config is not None:
            return dataclasses.replace(config, seed=seed)
        if setting is not None:
            from .settings import get_setting
            return get_setting(setting).config(variant, seed=seed)
        return UnlearnConfig(seed=seed)

    def run(model, splits, *, seed, device, progress):
        return _call_unlearn(name, model, splits, make_config(seed), seed=seed, device=device, progress=progress,
                             setting=setting, hparams=hparams, model_fn=model_fn, retrain_recipe=retrain_recipe,
                             **method_kwargs)

    hp = {"config": _jsonable(make_config(0)), "setting": setting, "variant": variant,
          "method_kwargs": _jsonable(method_kwargs)}
    if name not in TWO_STAGE_FAMILY:
        hp["hparams"] = hparams
        try:   # the preset's values, so that editing a preset invalidates its cached runs
            from .methods import get_method
            hp["preset"] = _jsonable(getattr(get_method(name), "presets", {}).get(setting, {}).get(hparams))
        except (ImportError, AttributeError, ValueError):
            pass
    if name == "retrain":
        hp["retrain_recipe"] = _jsonable(retrain_recipe)
    return MethodSpec(name, run, hp)


def _original_spec() -> MethodSpec:
    return MethodSpec("original", lambda model, splits, **_: UnlearnResult(model=model, report={}), {})


# ------------------------------------------------------------------------------------ caching
def _update_tensor(h, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def fingerprint(model: torch.nn.Module, splits: Splits) -> str:
    """SHA-256 (hex, 16 chars) of the model's state dict and of the splits: every tensor of
    datasets exposing ``.tensors``; for other datasets the length and 16 evenly spaced items."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        _update_tensor(h, v)
    for name, ds in splits.named().items():
        h.update(f"{name}:{len(ds)}".encode())
        tensors = getattr(ds, "tensors", None)
        if tensors is not None:
            for t in tensors:
                _update_tensor(h, t)
            continue
        for i in sorted({int(j) for j in np.linspace(0, len(ds) - 1, 16)}):
            buf = io.BytesIO()
            torch.save(ds[i], buf)
            h.update(buf.getvalue())
    return h.hexdigest()[:16]


class _Cache:
    """``out_dir/cache/<method>/seed<k>.json``, written atomically; None dir = no cache."""

    def __init__(self, out_dir):
        self.root = None if out_dir is None else Path(out_dir) / "cache"

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
        return rec if rec.get("key") == key else None

    def save(self, method: str, seed: int, rec: dict) -> None:
        p = self.path(method, seed)
        if p is None:
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, p)


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(_jsonable(parts), sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------ running
def _final_evals(report: Mapping[str, Any]) -> Optional[dict]:
    evals = report.get("evals") or {}
    if "final" in evals:
        return evals["final"]
    return list(evals.values())[-1] if evals else None


def _unlearn_seconds(report: Mapping[str, Any], wall: float) -> float:
    """``timings_s["unlearn"]``; else the sum of the non-evaluation timings; else the wall clock."""
    t = report.get("timings_s") or {}
    if "unlearn" in t:
        return float(t["unlearn"])
    parts = [v for k, v in t.items() if not k.startswith("eval")]
    return float(sum(parts)) if parts else wall


def _run_one(spec: MethodSpec, model, splits, seed: int, *, device, retrained, metric_kw) -> dict:
    m = copy.deepcopy(model)
    t = time.perf_counter()
    with preserved_rng():
        seed_everything(seed)
        res = spec.run(m, splits, seed=seed, device=device, progress=False)
    wall = time.perf_counter() - t
    report = dict(getattr(res, "report", None) or {})
    seconds = None if spec.name == "original" else _unlearn_seconds(report, wall)
    with preserved_rng():
        metrics = unlearning_metrics(res.model, splits, retrained=retrained, evals=_final_evals(report),
                                     seconds=seconds, device=device, seed=seed,
                                     keep_losses=spec.name == "retrain", **metric_kw)
    slim = {k: report[k] for k in ("method", "evals", "timings_s", "steps") if k in report}
    return {"method": spec.name, "seed": seed, "metrics": metrics, "report": _jsonable(slim), "wall_s": wall}


def _specs(methods, *, configs, **kw) -> List[MethodSpec]:
    if isinstance(methods, (str, MethodSpec)):
        methods = [methods]
    specs = [m if isinstance(m, MethodSpec) else method_spec(m, config=(configs or {}).get(m), **kw)
             for m in methods]
    names = [s.name for s in specs]
    if not specs or len(set(names)) != len(names) or "original" in names:
        raise ValueError(f"methods must be a non-empty list of distinct names (not 'original'), got {names}")
    retrain = [s for s in specs if s.name == "retrain"]
    return retrain + [_original_spec()] + [s for s in specs if s.name != "retrain"]


def _relearn_settings(relearn, model, splits, device, batch_size) -> Optional[dict]:
    if relearn is False:
        return None
    rl = {**DEFAULT_RELEARN, **(relearn or {})}
    acc = evaluate(model, splits, device=device, batch_size=batch_size, keep_forget_losses=False)["forget"]["acc"]
    rl["threshold"] = rl.pop("fraction") * acc
    return rl if rl["threshold"] > 0 else None   # nothing to relearn when θ0 gets no forget sample right


def compare(model: torch.nn.Module, splits: Splits, methods: Sequence[Union[str, MethodSpec]] = ("two_stage",),
            seeds: Sequence[int] = (0, 1, 2), *, setting: Optional[str] = None, variant: Optional[str] = None,
            hparams: str = "paper_code", out_dir=None, device=None, model_fn: Optional[Callable[[], torch.nn.Module]] = None,
            retrain_recipe=None, configs: Optional[Mapping[str, Any]] = None,
            relearn: Union[None, bool, Mapping[str, Any]] = None, mia_max_samples: Optional[int] = None,
            batch_size: int = 512, progress: bool = True) -> ComparisonResult:
    """Run every method of ``methods`` for every seed from the same original ``model`` and tabulate
    the metrics of docs/algorithm.md §10 (mean ± std over seeds).

    Args:
        model: the original model θ0 ((B, C) logits); never modified (each run gets a deep copy).
        splits: `Splits` with held-out retain data (the MIA non-members).
        methods: names (see `available_methods`; "retrain" is run first and is the reference of
            "avg_gap" and "forget_quality") or `MethodSpec` objects.
        seeds: distinct ints; each seeds its runs (data order, random labels, MIA and relearn subsets).
        setting, variant, hparams, model_fn, retrain_recipe: see `method_spec`. configs: {method
            name: config} overriding the presets.
        out_dir: where the table, JSON, PNG and the per-run cache go (None = nothing written, no cache).
        relearn: `DEFAULT_RELEARN` overrides, or False to skip relearn time.
        mia_max_samples: cap on MIA members / non-members. batch_size: evaluation batch.
        progress: a tqdm bar over the (method, seed) runs.
    Returns: `ComparisonResult`.
    Raises: ValueError (unknown or duplicate method, no seeds, no held-out retain split), and the
        errors of the methods and metrics (ImportError without scikit-learn / scipy).
    """
    from tqdm.auto import tqdm

    if not isinstance(splits, Splits):
        raise TypeError("splits must be an entangle_ext.Splits")
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct integers, got {seeds}")
    if splits.adjacent_test is None and splits.remote_test is None:
        raise ValueError("compare needs held-out retain data (adjacent_test / remote_test) for MIA-efficacy")
    specs = _specs(methods, configs=configs, setting=setting, variant=variant, hparams=hparams,
                   model_fn=model_fn, retrain_recipe=retrain_recipe)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).eval()
    rl = _relearn_settings(relearn, model, splits, device, batch_size)
    metric_kw = {"relearn": rl, "mia_max_samples": mia_max_samples, "batch_size": batch_size}
    fp, cache = fingerprint(model, splits), _Cache(out_dir)
    runs: Dict[str, Dict[int, dict]] = {s.name: {} for s in specs}
    retrained: Dict[int, dict] = {}
    bar = tqdm(total=len(specs) * len(seeds), desc="compare", disable=not progress, dynamic_ncols=True)
    for spec in specs:
        for seed in seeds:
            ref = retrained.get(seed)
            key = _key(CACHE_FORMAT, spec.name, seed, spec.hparams, fp, metric_kw, ref and ref["key"])
            bar.set_postfix_str(f"{spec.name} seed {seed}")
            rec = cache.load(spec.name, seed, key)
            if rec is None:
                rec = {"key": key, **_run_one(spec, model, splits, seed, device=device,
                                              retrained=ref and ref["metrics"], metric_kw=metric_kw)}
                cache.save(spec.name, seed, rec)
            if spec.name == "retrain":
                retrained[seed] = rec
            runs[spec.name][seed] = {k: v for k, v in rec["metrics"].items() if k != "forget_losses"}
            bar.update(1)
    bar.close()
    order = [s.name for s in specs]
    summary = summarize(runs)
    res = ComparisonResult(table=format_markdown(summary, seeds=seeds, order=order), summary=summary, runs=runs,
                           seeds=seeds, methods=order, relearn=rl)
    if out_dir is not None:
        _write(res, Path(out_dir), fp)
    return res


def _write(res: ComparisonResult, out: Path, fp: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res.paths = {"markdown": str(out / "comparison.md"), "json": str(out / "comparison.json"),
                 "png": str(out / "comparison.png")}
    Path(res.paths["markdown"]).write_text(res.table + "\n")
    Path(res.paths["json"]).write_text(json.dumps({**res.to_dict(), "fingerprint": fp}, indent=1))
    plot_comparison(res.summary, res.paths["png"], order=res.methods)
