"""`compare`: several unlearning methods from one original model, over seeds, in one table.

    result = entangle_ext.compare(model, splits, methods=["retrain", "two_stage", "salun"],
                                  seeds=[0, 1, 2], setting="digits", out_dir="runs/compare",
                                  model_fn=build_fresh_model, retrain_recipe=recipe)
    print(result.table)

Every (method, seed) run starts from a deep copy of ``model`` and is scored by `unlearning_metrics`
(``from entangle_ext.unlearn.metrics import unlearning_metrics``; docs/algorithm.md §10); the
retrained model of the same seed is the reference of the gap metrics; the row "original" scores
``model`` itself. Outputs under ``out_dir``: ``comparison.md`` (mean ± std over seeds; one value
per cell for one seed; rows = methods, columns = metrics with their direction, best per column
in bold when two or more unlearning methods are compared), ``comparison.json`` and ``comparison.png``, and
``cache/<method>/seed<k>.json``: one file per finished run, keyed on the method, the seed, its
effective hyperparameters and a fingerprint of the splits and the original model, so a rerun after an
interruption (or with more methods / seeds) only runs what is missing. The key does not hold the
device or the torch version (a cache made on one machine serves another); each record notes them,
and a record made with another torch version or device type is reused with a `UserWarning` that
names the file to delete to recompute it.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import numbers
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

from .unlearn import NonFiniteLossError, Splits, UnlearnResult, evaluate, unlearn
from .unlearn.data import check_batch_size
from .unlearn.checkpoint import preserved_rng, seed_everything
from .unlearn.fingerprint import fingerprint
from .unlearn.inputs import model_device
from .unlearn.lock import out_dir_lock
from .compare_report import TABLE_COLUMNS, format_markdown, plot_comparison, summarize
from .unlearn.files import atomic_write
from .unlearn.report import plot_available
from .unlearn.metrics import METRICS, NonFiniteOutputError, check_relearn_args, unlearning_metrics

__all__ = ["compare", "ComparisonResult", "MethodSpec", "method_spec", "method_config", "effective_config",
           "scale_budget", "check_method_names", "available_methods", "fingerprint",
           "summarize", "format_markdown", "plot_comparison", "TABLE_COLUMNS", "DEFAULT_RELEARN"]

DEFAULT_RELEARN = {"fraction": 0.9, "subset": 0.1, "lr": 1e-3, "max_steps": 100, "batch_size": 64}
"""Relearn time: threshold = ``fraction`` × the original model's forget-train accuracy; the rest are
`relearn_time` arguments."""
CACHE_FORMAT = 2
"""Part of every cache key: 2 since an MIA attack without signal scores NaN (undefined) instead of
0 or 100 %, so records of format 1 (coin-flip MIA values) are recomputed, not reused."""


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
        "n"}}} (std None for one seed; over the defined values, see `summarize`). runs: {method:
        {seed: {metric: value}}} (NaN = undefined: an MIA attack without signal; null in the JSON
        and cache files). seeds, methods: as run. paths: files written ({"markdown", "json", "png"}; empty without ``out_dir``).
        relearn: relearn settings.
        hparams: {method: the `MethodSpec.hparams` it ran with (a registered method's effective
        config without its seed, setting, variant, hparams family)}.
        failures: {method: {seed: message}} of the runs that stopped on a non-finite loss (their
        cells are "–"; listed under the table).
        budget: the common factor of every method's training passes (`scale_budget`; 1 = the presets).
    """
    table: str
    summary: Dict[str, Dict[str, Dict[str, Any]]]
    runs: Dict[str, Dict[int, Dict[str, Any]]]
    seeds: List[int]
    methods: List[str]
    paths: Dict[str, str] = field(default_factory=dict)
    relearn: Optional[Dict[str, Any]] = None
    hparams: Dict[str, Any] = field(default_factory=dict)
    failures: Dict[str, Dict[int, str]] = field(default_factory=dict)
    budget: float = 1.0

    def to_dict(self) -> Dict[str, Any]:
        return {"methods": self.methods, "seeds": self.seeds, "budget": self.budget, "relearn": self.relearn,
                "hparams": self.hparams,
                "metrics": {k: dataclasses.asdict(v) for k, v in METRICS.items()},
                "summary": self.summary, "runs": {m: {str(s): r for s, r in v.items()} for m, v in self.runs.items()},
                "failures": {m: {str(s): e for s, e in v.items()} for m, v in self.failures.items()},
                "table": self.table}


# ------------------------------------------------------------------------------------ methods
def available_methods() -> List[str]:
    """Names `compare` can run: `entangle_ext.methods.available_methods()` (the baselines, then
    the two-stage family)."""
    return list(_methods().available_methods())


def _methods():
    from . import methods   # lazy: the registry imports the settings and every method module
    return methods


def _json_nan_free(obj) -> Any:
    """``obj`` with every NaN / ±Inf float (an undefined metric, e.g. MIA-efficacy without signal)
    replaced by None: JSON has no NaN (``json.dumps(..., allow_nan=False)`` then holds)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: _json_nan_free(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_nan_free(v) for v in obj]
    return obj


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


def method_config(name: str, *, setting: Optional[str] = None, variant: Optional[str] = None,
                  hparams: str = "paper_code", config=None, retrain_recipe=None):
    """The configuration `compare` hands to ``entangle_ext.unlearn(..., method=name)`` (each run
    then sets its own ``seed``):

    * ``config`` itself when given (an `UnlearnConfig` for the two-stage family, exactly the
      method's own ``Config`` for a baseline, a `TrainRecipe` or `RetrainConfig` for "retrain");
    * "retrain": ``RetrainConfig(recipe=retrain_recipe)``; else, for hparams "paper_code" on a
      registered setting, the recipe of ``variant`` (the one `entangle_ext.settings.prepare`
      trained θ0 with); else None (its ``hparams`` preset);
    * the two-stage family on a registered setting: `Setting.config` of ``variant`` (the preset
      with the variant's stage overrides) in the recipe of ``hparams`` ("paper_code" → the
      reference code, "original" → the paper's text, docs/algorithm.md §7); else None;
    * other baselines: None, i.e. the ``hparams`` preset of ``setting`` (docs/algorithm.md §10).

    Raises ValueError for an unknown method, setting, variant or hparams.
    """
    M = _methods()
    cls = M.get_method(name)
    if hparams not in M.HPARAMS:
        raise ValueError(f"hparams must be one of {M.HPARAMS}, got {hparams!r}")
    if config is not None:
        return config
    from .settings import SETTINGS
    v = SETTINGS[setting].variant(variant) if setting in SETTINGS else None
    if name == "retrain":
        if retrain_recipe is None and v is not None and hparams == "paper_code":
            retrain_recipe = v.recipe
        return None if retrain_recipe is None else cls.Config(recipe=retrain_recipe)
    if cls.two_stage and v is not None:
        from .methods.ablations import RECIPE_OF_HPARAMS
        return SETTINGS[setting].config(v, recipe=RECIPE_OF_HPARAMS[hparams])
    return None


def effective_config(name: str, config=None, *, setting: Optional[str] = None, hparams: str = "paper_code"):
    """What ``entangle_ext.unlearn(model, splits, config, method=name, setting=, hparams=)`` runs:
    the two-stage family's rewritten `UnlearnConfig`, a baseline's resolved ``Config`` (its preset
    when ``config`` is None). Raises as `entangle_ext.unlearn` for a bad config / setting / hparams."""
    cls = _methods().get_method(name)
    return cls.resolve_config(config, setting, hparams).validate()


def check_budget(budget) -> float:
    """``budget`` as a float: a finite real > 0 (not a bool); ValueError / TypeError otherwise."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a real number > 0 (1 = the presets), got {budget!r}")
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a finite number > 0 (1 = the presets), got {budget!r}")
    return float(budget)


def _scaled_passes(n: Optional[int], factor: float) -> Optional[int]:
    """ceil(n × factor), at least 1 when n >= 1; 0 and None stay as they are. ValueError when the
    product is not a finite number (a factor like 1e308)."""
    if n is None or n == 0:
        return n
    x = n * factor - 1e-9   # the tolerance keeps 15 × 0.6 at 9, not 10
    if not math.isfinite(x):
        raise ValueError(f"budget {factor!r} × {n} training passes is not a finite number of passes")
    return max(1, math.ceil(x))


def _replace_path(obj, path: str, fn):
    head, _, rest = path.partition(".")
    value = getattr(obj, head)
    return dataclasses.replace(obj, **{head: _replace_path(value, rest, fn) if rest else fn(value)})


def scale_budget(name: str, config=None, factor: float = 1.0, *, setting: Optional[str] = None,
                 hparams: str = "paper_code"):
    """The config of method ``name`` with every count of training passes multiplied by ``factor``
    and rounded up to a whole number (ceil; at least 1 where it was >= 1; 0 and None stay): the
    fields of the config class's ``budget_fields`` — ``epochs`` of every training baseline (SCRUB's
    ``msteps`` too), Retrain's ``recipe.epochs``, the two-stage family's ``stage1.epochs``,
    ``stage1.max_steps`` and ``stage2.epochs``. A method without a training loop (SSD) is
    unchanged. Used by `compare` (``budget=``) for a CPU-sized comparison in which every method
    gets the same share of its preset (the issue's "one common factor").

    Args:
        name: a registered method. config: its config, or None for the ``hparams`` preset of
            ``setting`` (resolved as `entangle_ext.unlearn` would). factor: > 0 (float).
    Returns: for factor 1, ``config`` itself as given (None stays None; only the factor is
        checked: the method and config are checked where they are used). Otherwise a new
        validated config of the method's type (`UnlearnConfig` for the two-stage family; a bare
        `TrainRecipe` given to "retrain" comes back as its `RetrainConfig`).
    Raises: ValueError / TypeError for a bad factor (also one that makes a count of passes
        non-finite), and, for factor != 1, a bad method, setting, hparams or config type.
    """
    factor = check_budget(factor)
    if factor == 1.0:
        return config
    M = _methods()
    cls = M.get_method(name)
    cfg = cls.resolve_config(copy.deepcopy(config), setting, hparams)
    for path in type(cfg).budget_fields:
        cfg = _replace_path(cfg, path, lambda n: _scaled_passes(n, factor))
    return cfg.validate()


def method_spec(name: str, *, setting: Optional[str] = None, variant: Optional[str] = None,
                hparams: str = "paper_code", config=None, model_fn=None, retrain_recipe=None,
                budget: float = 1.0) -> MethodSpec:
    """The `MethodSpec` of a registered method: each run is ``entangle_ext.unlearn(model, splits,
    method_config(...), method=name, setting=setting, hparams=hparams, seed=seed)``, with
    ``model_fn`` for "retrain" (None: Retrain re-initialises a copy of θ0 with each module's
    ``reset_parameters``, from the seed). The spec's ``hparams`` (its cache key) hold the
    `effective_config` without its seed, ``setting`` / ``variant`` / ``hparams``, ``budget`` when
    it is not 1 (the config is then `scale_budget`'s) and, for "retrain", the qualified name of
    ``model_fn``.
    Raises ValueError for an unknown name, setting, variant, hparams or a budget <= 0; TypeError for
    a config of another method.
    """
    names = available_methods()
    if name not in names:
        raise ValueError(f"unknown method {name!r}; available here: {names}")
    cfg = method_config(name, setting=setting, variant=variant, hparams=hparams, config=config,
                        retrain_recipe=retrain_recipe)
    budget = check_budget(budget)
    cfg = scale_budget(name, cfg, budget, setting=setting, hparams=hparams)
    eff = _jsonable(effective_config(name, copy.deepcopy(cfg), setting=setting, hparams=hparams))
    eff.pop("seed", None)

    def run(model, splits, *, seed, device, progress):
        return unlearn(model, splits, copy.deepcopy(cfg), method=name, setting=setting, hparams=hparams,
                       model_fn=model_fn if name == "retrain" else None, seed=seed, device=device,
                       progress=progress)

    hp = {"config": eff, "setting": setting, "variant": variant, "hparams": hparams}
    if budget != 1.0:   # (absent at 1: the cache keys of full-budget runs stay as they were)
        hp["budget"] = budget
    if name == "retrain":   # what builds the fresh model (by name: a function's repr changes every process)
        hp["model_fn"] = None if model_fn is None else \
            f"{getattr(model_fn, '__module__', '')}.{getattr(model_fn, '__qualname__', type(model_fn).__name__)}"
    return MethodSpec(name, run, hp)


def _original_spec() -> MethodSpec:
    return MethodSpec("original", lambda model, splits, **_: UnlearnResult(model=model, report={}), {})


# ------------------------------------------------------------------------------------ caching
class _Cache:
    """``out_dir/cache/<method>/seed<k>.json``, written atomically; None dir = no cache."""

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
        if rec.get("key") != key:
            return None
        for k in rec.get("nan_metrics", ()):   # stored as null (JSON has no NaN): back to NaN
            rec["metrics"][k] = math.nan
        env, here = rec.get("env"), _env(self.device)
        if env is not None and env != here:
            warnings.warn(f"compare: reusing the cached {method} seed {seed} made with torch {env.get('torch')} "
                          f"on {env.get('device')} (this run: torch {here['torch']} on {here['device']}); "
                          f"delete {p} to recompute it", UserWarning, stacklevel=3)
        return rec

    def save(self, method: str, seed: int, rec: dict) -> None:
        p = self.path(method, seed)
        if p is None:
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        nan = sorted(k for k, v in rec.get("metrics", {}).items() if isinstance(v, float) and math.isnan(v))
        text = json.dumps(_json_nan_free({**rec, **({"nan_metrics": nan} if nan else {}), "env": _env(self.device)}),
                          allow_nan=False)   # (one temporary file per process: --jobs workers share the dir)
        atomic_write(p, lambda tmp: tmp.write_text(text), what="comparison cache entry",
                     hint="the runs cached so far are kept: free space and rerun the same command to go on")


def cached_note(reused: Mapping[str, Sequence[int]], root: Optional[Path]) -> str:
    """The line under the table naming the results reused from the cache, e.g. "cached: ft seeds
    0,1 (from OUT/cache; delete to recompute)"."""
    parts = "; ".join(f"{m} seed{'s' if len(k) > 1 else ''} {','.join(str(i) for i in k)}" for m, k in reused.items())
    return f"cached: {parts} (from {root}; delete to recompute)"


def _env(device) -> Dict[str, str]:
    """What a cached record notes about where it was computed (not part of its key)."""
    return {"torch": torch.__version__, "device": "cpu" if device is None else torch.device(device).type}


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


class _Diverged(ValueError):
    """A run whose unlearned model cannot be scored (non-finite outputs): recorded like a
    `NonFiniteLossError`."""


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
        try:
            metrics = unlearning_metrics(res.model, splits, retrained=retrained, evals=_final_evals(report),
                                         seconds=seconds, device=device, seed=seed,
                                         keep_losses=spec.name == "retrain", **metric_kw)
        except NonFiniteOutputError as e:
            if spec.name == "original":
                raise
            raise _Diverged(f"{spec.name}: the unlearned model returns non-finite logits ({e}); the run "
                            "diverged without a non-finite loss at a checked step") from e
    slim = {k: report[k] for k in ("method", "hparams", "setting", "config", "evals", "timings_s", "steps")
            if k in report}
    return {"method": spec.name, "seed": seed, "metrics": metrics, "report": _jsonable(slim), "wall_s": wall}


def check_method_names(names: Sequence[str], *, known: Optional[Sequence[str]] = None) -> List[str]:
    """The row names of a comparison, checked: ValueError for no name, 'original' (always a row of
    its own), a name given twice and, when ``known`` is given, a name not in it. Used by `compare`
    and, before any data is loaded, by ``entangle-unlearn compare`` (which says ``--methods``)."""
    names = list(names)
    if not names:
        raise ValueError("methods is empty")
    if "original" in names:
        raise ValueError("methods: 'original' is not a method (the original model is always a row of the table)")
    unknown = [m for m in names if known is not None and m not in known]
    if unknown:
        raise ValueError(f"methods: unknown method {unknown[0]!r}; available here: {list(known)}")
    repeated = sorted({m for m in names if names.count(m) > 1})
    if repeated:
        raise ValueError(f"methods names {', '.join(repeated)} more than once (they must be distinct)")
    return names


def _specs(methods, *, configs, **kw) -> List[MethodSpec]:
    if isinstance(methods, (str, MethodSpec)):
        methods = [methods]
    specs = [m if isinstance(m, MethodSpec) else method_spec(m, config=(configs or {}).get(m), **kw)
             for m in methods]
    check_method_names([s.name for s in specs])
    retrain = [s for s in specs if s.name == "retrain"]
    return retrain + [_original_spec()] + [s for s in specs if s.name != "retrain"]


def _seed_list(seeds) -> List[int]:
    """``seeds`` as a list of distinct ints (ValueError / TypeError otherwise)."""
    if isinstance(seeds, (numbers.Integral, str)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a sequence of integers such as [0, 1, 2] or range(3), got "
                        f"{type(seeds).__name__} {seeds!r} (the command line's --seeds N means range(N))")
    seeds = list(seeds)
    bad = [x for x in seeds if not isinstance(x, numbers.Integral) or isinstance(x, bool)]
    if bad:
        raise TypeError(f"seeds must be integers, got {bad}")
    seeds = [int(x) for x in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct integers, got {seeds}")
    return seeds


def _check_relearn(relearn) -> None:
    """The relearn argument of `compare`, checked before any run (ValueError / TypeError)."""
    if relearn is None or relearn is False:
        return
    if not isinstance(relearn, Mapping):
        raise TypeError(f"relearn must be None, False or a dict of {sorted(DEFAULT_RELEARN)}, got {relearn!r}")
    unknown = sorted(set(relearn) - set(DEFAULT_RELEARN))
    if unknown:
        raise ValueError(f"relearn has unknown keys {unknown}; known: {sorted(DEFAULT_RELEARN)}")
    rl = {**DEFAULT_RELEARN, **relearn}
    if not (isinstance(rl["fraction"], numbers.Real) and 0 < rl["fraction"] <= 1):
        raise ValueError(f"relearn: fraction must be in (0, 1], got {rl['fraction']!r}")
    check_relearn_args(**{k: v for k, v in rl.items() if k != "fraction"})


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
            batch_size: int = 512, budget: float = 1.0, write_tables: bool = True,
            progress: bool = True) -> ComparisonResult:
    """Run every method of ``methods`` for every seed from the same original ``model`` and tabulate
    the metrics of docs/algorithm.md §10 (mean ± std over seeds).

    Args:
        model: the original model θ0 ((B, C) logits); never modified (each run gets a deep copy;
            its train/eval flags are left as they are), only moved to ``device``.
        splits: `Splits` with held-out retain data (the MIA non-members).
        methods: names (see `available_methods`; "retrain" is run first and is the reference of
            "avg_gap" and "forget_quality") or `MethodSpec` objects.
        seeds: distinct ints; each is the ``seed`` of its runs (``unlearn(..., seed=)``: data order,
            random labels, Retrain's initial weights) and of their MIA and relearn subsets.
        setting, variant, hparams, model_fn, retrain_recipe: see `method_config` / `method_spec`
            (registered settings: `entangle_ext.settings`). configs: {method name: config}
            overriding the presets.
        out_dir: where the table, JSON, PNG and the per-run cache go (None = nothing written, no cache).
        relearn: `DEFAULT_RELEARN` overrides, or False to skip relearn time.
        mia_max_samples: cap on MIA members / non-members. batch_size: evaluation batch.
        budget: one common factor (> 0) of every registered method's training passes
            (`scale_budget`: epochs rounded up; also the configs given in ``configs``; not a
            `MethodSpec` given as such); said under the table when it is not 1.
        write_tables: False writes only the per-run cache under ``out_dir`` (no table, JSON or
            PNG; what the workers of ``entangle-unlearn compare --jobs N`` do). With True (the
            default) ``out_dir`` is locked for the call (``OUT/.entangle_ext.lock``): a second
            live comparison or unlearning run into it raises `OutDirInUseError` (a ValueError),
            before any run; without, no lock is taken (the cache writes are atomic).
        progress: a tqdm bar over the (method, seed) runs.
    Returns: `ComparisonResult`. A run that stops on a non-finite loss (`NonFiniteLossError`, e.g. a
        baseline whose preset diverges on this model), or whose unlearned model returns non-finite
        logits when scored (weights grown past float range without a NaN loss), is recorded, cached and listed under the table
        ("–" in its cells), and the comparison goes on; Retrain failing leaves its seed without
        gap metrics.
    Raises, before any run: ValueError (unknown or duplicate method, setting, variant or hparams;
        no seeds or repeated seeds; a ``configs`` entry for a method not compared; an unknown
        ``relearn`` key or a bad relearn value; ``batch_size`` < 1; ``budget`` <= 0;
        ``mia_max_samples`` < 1; a missing or empty forget / adjacent / remote train split; no
        held-out retain split), TypeError (a config of another method; ``seeds`` not a sequence of
        integers, e.g. a bare int; a budget that is not a number). Later: the other errors of the methods and metrics
        (ImportError without scikit-learn / scipy); a ValueError for a model without
        parameters or buffers when ``device`` is None.
    """
    from ._progress import progress_bar

    if not isinstance(splits, Splits):
        raise TypeError("splits must be an entangle_ext.Splits")
    seeds = _seed_list(seeds)
    splits.check(("forget", "adjacent", "remote"), by="compare (its metrics are per split)")
    if splits.adjacent_test is None and splits.remote_test is None:
        raise ValueError("compare needs held-out retain data (adjacent_test / remote_test) for MIA-efficacy")
    budget = check_budget(budget)
    specs = _specs(methods, configs=configs, setting=setting, variant=variant, hparams=hparams,
                   model_fn=model_fn, retrain_recipe=retrain_recipe, budget=budget)
    stray = sorted(set(configs or {}) - {sp.name for sp in specs})
    if stray:
        raise ValueError(f"configs has entries for methods that are not compared: {stray} "
                         f"(compared: {[sp.name for sp in specs if sp.name != 'original']})")
    _check_relearn(relearn)
    check_batch_size(batch_size, "compare: batch_size")
    if mia_max_samples is not None and not (isinstance(mia_max_samples, int) and mia_max_samples >= 1):
        raise ValueError(f"compare: mia_max_samples must be None or an int >= 1, got {mia_max_samples!r}")
    # one live comparison per out dir (OutDirInUseError otherwise); write_tables=False (the --jobs
    # workers) only adds to the per-run cache, atomically, under the lock of the parent
    from .unlearn.metrics import require_metric_dependencies
    require_metric_dependencies()   # before any run: MIA-efficacy needs scikit-learn
    with out_dir_lock(out_dir if write_tables else None):
        device = model_device(model, device)
        model.to(device)   # its train/eval flags stay: every evaluation sets eval mode and restores them
        rl = _relearn_settings(relearn, model, splits, device, batch_size)
        metric_kw = {"relearn": rl, "mia_max_samples": mia_max_samples, "batch_size": batch_size}
        fp, cache = fingerprint(model, splits), _Cache(out_dir, device)
        runs: Dict[str, Dict[int, dict]] = {s.name: {} for s in specs}
        retrained: Dict[int, dict] = {}
        failures: Dict[str, Dict[int, str]] = {}
        reused: Dict[str, List[int]] = {}   # the (method, seed) results taken from the cache
        bar = progress_bar(total=len(specs) * len(seeds), desc="compare", enabled=progress)
        for spec in specs:
            for seed in seeds:
                ref = retrained.get(seed)
                key = _key(CACHE_FORMAT, spec.name, seed, spec.hparams, fp, metric_kw, ref and ref["key"])
                bar.set_postfix_str(f"{spec.name} seed {seed}")
                rec = cache.load(spec.name, seed, key)
                if rec is not None:
                    reused.setdefault(spec.name, []).append(seed)
                if rec is None:
                    try:
                        rec = {"key": key, **_run_one(spec, model, splits, seed, device=device,
                                                      retrained=ref and ref["metrics"], metric_kw=metric_kw)}
                    except (NonFiniteLossError, _Diverged) as e:   # a diverging method is a result, not a crash
                        rec = {"key": key, "method": spec.name, "seed": seed, "metrics": {}, "failed": str(e)}
                    cache.save(spec.name, seed, rec)
                if rec.get("failed"):
                    failures.setdefault(spec.name, {})[seed] = rec["failed"]
                elif spec.name == "retrain":
                    retrained[seed] = rec
                runs[spec.name][seed] = {k: v for k, v in rec["metrics"].items() if k != "forget_losses"}
                bar.update(1)
        bar.close()
        order = [s.name for s in specs]
        summary = summarize(runs)
        table = format_markdown(summary, seeds=seeds, order=order, failures=failures, budget=budget)
        if reused:
            table += "\n\n" + cached_note(reused, cache.root)
        res = ComparisonResult(table=table, summary=summary, runs=runs, seeds=seeds, methods=order, relearn=rl,
                               hparams={s.name: s.hparams for s in specs}, failures=failures, budget=budget)
        if out_dir is not None and write_tables:
            _write(res, Path(out_dir), fp)
        return res


def _write(res: ComparisonResult, out: Path, fp: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res.paths = {"markdown": str(out / "comparison.md"), "json": str(out / "comparison.json"),
                 "png": str(out / "comparison.png")}
    again = "every run is cached: free space and rerun the same command to write the tables"
    atomic_write(res.paths["markdown"], lambda tmp: tmp.write_text(res.table + "\n"), what="comparison table",
                 hint=again)
    text = json.dumps(_json_nan_free({**res.to_dict(), "fingerprint": fp}), indent=1, allow_nan=False)
    atomic_write(res.paths["json"], lambda tmp: tmp.write_text(text), what="comparison JSON", hint=again)
    if not plot_available(res.paths["png"]):
        del res.paths["png"]
        return
    plot_comparison(res.summary, res.paths["png"], order=res.methods)
