"""`compare`: several unlearning methods from one original model, over seeds, in one table.

    result = entangle_ext.compare(model, splits, methods=["retrain", "two_stage", "salun"],
                                  seeds=[0, 1, 2], setting="digits", out_dir="runs/compare",
                                  model_fn=build_fresh_model, retrain_recipe=recipe)
    print(result.table)

Every (method, seed) run starts from a deep copy of ``model`` and is scored by `unlearning_metrics`
(``from entangle_ext.unlearn.metrics import unlearning_metrics``; docs/algorithm.md §10); the
retrained model of the same seed is the reference of the gap metrics; the row "original" scores
``model`` itself. The evaluation of ``model`` that every run makes before its first step is made
once per seed and evaluation settings and copied into the later runs (`original_eval_scope`; the
runs are bit-identical to runs that evaluate it themselves). Outputs under ``out_dir``: ``comparison.md`` (mean ± std over seeds; one value
per cell for one seed; rows = methods, columns = metrics with their direction, best per column
in bold among the unlearning methods that keep the adjacent and remote accuracy within ± ``band``
points of the original's, when two or more of them have the metric; the rule is stated under the
table), ``comparison.json`` and ``comparison.png``, and
``cache/<method>/seed<k>.json``: one file per finished run, keyed on the method, the seed, its
effective hyperparameters (Retrain's also the model its ``model_fn`` builds: `compare_specs.model_fn_key`)
and a fingerprint of the splits and the original model, so a rerun after an
interruption (or with more methods / seeds) only runs what is missing. The key does not hold the
device or the torch version (a cache made on one machine usually serves another: the fingerprint
holds the model's outputs rounded to 6 digits, which another CPU's kernels can change at a
rounding boundary, `model_fingerprint`); each record notes them,
and a record made with another torch version or device type is reused with a `UserWarning` that
names the file to delete to recompute it.
"""
from __future__ import annotations

import dataclasses
import json
import numbers
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

from ._paths import expand_user
from .unlearn.data import Splits, batch_warning_scope
from .unlearn.memory_format import channels_last_scope
from .unlearn.loop import NonFiniteLossError
from .unlearn.data import check_batch_size
from .unlearn.disjoint import disjoint_scope
from .unlearn.checkpoint import preserved_rng, seed_everything
from .unlearn.fields import SEED_MAX, SEED_MIN
from .unlearn.fingerprint import fingerprint
from .unlearn.inputs import check_model_and_splits, model_device, preflight, require_trainable, training_flags_kept
from .unlearn.model_copy import copy_model
from .unlearn.original_eval import original_eval_scope
from .unlearn.final_outputs import FinalOutputs
from .unlearn.precision import model_dtype
from .unlearn.lock import out_dir_lock
from .compare_relearn import DEFAULT_RELEARN, check_relearn as _check_relearn, relearn_settings as _relearn_settings
from .compare_report import (BOLD_BAND, TABLE_COLUMNS, check_band, format_markdown, plot_comparison, summarize,
                             warn_undefined_mia)
from .unlearn.files import atomic_write
from .compare_specs import (MethodSpec, available_methods, build_specs, check_budget, check_method_names,
                            effective_config, method_config, method_spec, scale_budget)
from .compare_cache import (CACHE_FORMAT, ResultCache, cache_key, cached_note, json_nan_free, jsonable,
                            record_metrics, resolved_amp_fields)
from .unlearn.report import plot_available
from .unlearn.evaluate import NonFiniteOutputError
from .unlearn.metrics import METRICS, mia_undefined_scope, unlearning_metrics

__all__ = ["compare", "ComparisonResult", "MethodSpec", "method_spec", "method_config", "effective_config",
           "scale_budget", "check_method_names", "available_methods", "fingerprint",
           "summarize", "format_markdown", "plot_comparison", "TABLE_COLUMNS", "DEFAULT_RELEARN"]



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
        band: the bold rule's band in percentage points (`format_markdown`; None = no band).
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
    band: Optional[float] = BOLD_BAND

    def to_dict(self) -> Dict[str, Any]:
        return {"methods": self.methods, "seeds": self.seeds, "budget": self.budget, "band": self.band,
                "relearn": self.relearn,
                "hparams": self.hparams,
                "metrics": {k: dataclasses.asdict(v) for k, v in METRICS.items()},
                "summary": self.summary, "runs": {m: {str(s): r for s, r in v.items()} for m, v in self.runs.items()},
                "failures": {m: {str(s): e for s, e in v.items()} for m, v in self.failures.items()},
                "table": self.table}


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


def _run_one(spec: MethodSpec, model, splits, seed: int, *, device, metric_kw) -> dict:
    m = copy_model(model, "compare runs every method on its own copy of the model")
    t = time.perf_counter()
    with preserved_rng(), FinalOutputs() as kept:   # the run's float32 evaluations keep their logits
        seed_everything(seed)
        res = spec.run(m, splits, seed=seed, device=device, progress=False)
    wall = time.perf_counter() - t
    report = dict(getattr(res, "report", None) or {})
    seconds = None if spec.name == "original" else _unlearn_seconds(report, wall)
    # the metrics' forward passes in the memory format the run used (report["channels_last"])
    channels_last = bool(report.get("channels_last", False))
    with preserved_rng(), channels_last_scope(channels_last):
        try:
            # the run's last evaluation, when it is of this model with the metrics' batch size and
            # no autocast, gives the MIA its per-sample values (bit-identical; no second pass)
            feats = kept.features(res.model, batch_size=metric_kw["batch_size"], channels_last=channels_last)
            # every record keeps its forget losses: the gap metrics are added when the table is
            # assembled (`record_metrics`), so no run waits for, or is keyed on, its seed's Retrain
            metrics = unlearning_metrics(res.model, splits, evals=_final_evals(report), seconds=seconds,
                                         device=device, seed=seed, keep_losses=True, features=feats,
                                         **metric_kw)
        except NonFiniteOutputError as e:
            if spec.name == "original":
                raise
            raise _Diverged(f"{spec.name}: the unlearned model returns non-finite logits ({e}); the run "
                            "diverged without a non-finite loss at a checked step") from e
    slim = {k: report[k] for k in ("method", "hparams", "setting", "config", "evals", "timings_s", "steps")
            if k in report}
    return {"method": spec.name, "seed": seed, "metrics": metrics, "report": jsonable(slim), "wall_s": wall}


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
    out_of_range = [x for x in seeds if not SEED_MIN <= x <= SEED_MAX]
    if out_of_range:
        raise ValueError(f"seeds must lie in [{SEED_MIN}, {SEED_MAX}] (torch.manual_seed's range), got "
                         f"{out_of_range}")
    return seeds



def compare(model: torch.nn.Module, splits: Splits, methods: Sequence[Union[str, MethodSpec]] = ("two_stage",),
            seeds: Sequence[int] = (0, 1, 2), *, setting: Optional[str] = None, variant: Optional[str] = None,
            hparams: str = "paper_code", out_dir=None, device=None, model_fn: Optional[Callable[[], torch.nn.Module]] = None,
            retrain_recipe=None, configs: Optional[Mapping[str, Any]] = None,
            relearn: Union[None, bool, Mapping[str, Any]] = None, mia_max_samples: Optional[int] = None,
            batch_size: int = 512, budget: float = 1.0, band: Optional[float] = BOLD_BAND,
            write_tables: bool = True, progress: bool = True, session: Optional[str] = None) -> ComparisonResult:
    """Run every method of ``methods`` for every seed from the same original ``model`` and tabulate
    the metrics of docs/algorithm.md §10 (mean ± std over seeds).

    Args:
        model: the original model θ0 ((B, C) logits); never modified (each run gets a deep copy;
            its train/eval flags are left as they are), only moved to ``device``.
        splits: `Splits` with held-out retain data (the MIA non-members).
        methods: names (see `available_methods`; "retrain" is run first and is the reference of
            "avg_gap", "forget_quality" and "forget_ks", which are computed from the cached records
            when the table is assembled) or `MethodSpec` objects. An empty list, with
            ``write_tables=False`` only, scores the original model alone (what a ``--jobs`` worker
            does first for each seed, `compare_jobs.plan_tasks`).
        seeds: distinct ints; each is the ``seed`` of its runs (``unlearn(..., seed=)``: data order,
            random labels, Retrain's initial weights) and of their MIA and relearn subsets.
        setting, variant, hparams, model_fn, retrain_recipe: see `method_config` / `method_spec`
            (registered settings: `entangle_ext.settings`). configs: {method name: config}
            overriding the presets.
        out_dir: where the table, JSON, PNG and the per-run cache go (None = nothing written, no
            cache; a leading ``~`` is the home directory).
        relearn: `DEFAULT_RELEARN` overrides, or False to skip relearn time.
        mia_max_samples: cap on MIA members / non-members. batch_size: evaluation batch.
        budget: one common factor (> 0) of every registered method's training passes
            (`scale_budget`: epochs rounded up; also the configs given in ``configs``; not a
            `MethodSpec` given as such); said under the table when it is not 1.
        band: the bold rule (`format_markdown`): a value is bold only among the unlearning methods
            whose mean adjacent and remote held-out accuracy stay within ± ``band`` percentage
            points of the original model's (default `BOLD_BAND` = 5; None = no band); stated
            under the table. Not part of any cache key (it only changes the table).
        write_tables: False writes only the per-run cache under ``out_dir`` (no table, JSON or
            PNG, and no `MIAUndefinedWarning`: the call that writes the tables warns for the runs
            of its session; what the workers of ``entangle-unlearn compare --jobs N`` do). With True (the
            default) ``out_dir`` is locked for the call (``OUT/.entangle_ext.lock``): a second
            live comparison or unlearning run into it raises `OutDirInUseError` (a ValueError),
            before any run; without, no lock is taken (the cache writes are atomic).
        progress: a tqdm bar over the (method, seed) runs.
        session: an id of the invocation this call belongs to, stored in the cache records it
            writes (not part of any cache key): a record written under the same id (by the
            ``entangle-unlearn compare --jobs N`` workers of the same command) counts as computed
            now; only records made before (another id, or None) are listed as cached under the
            table. None (default): only the records that existed before this call are.
    Returns: `ComparisonResult`. A run that stops on a non-finite loss (`NonFiniteLossError`, e.g. a
        baseline whose preset diverges on this model), or whose unlearned model returns non-finite
        logits when scored (weights grown past float range without a NaN loss), is recorded, cached and listed under the table
        ("–" in its cells), and the comparison goes on; Retrain failing leaves its seed without
        gap metrics.
    Raises, before any run: ValueError (unknown or duplicate method, setting, variant or hparams;
        no seeds, repeated seeds or a seed outside torch.manual_seed's [-2**63, 2**64 - 1]; a ``configs`` entry for a method not compared; an unknown
        ``relearn`` key or a bad relearn value; ``batch_size`` < 1; ``budget`` <= 0;
        ``mia_max_samples`` < 1; a negative or non-finite ``band``; a missing or empty forget / adjacent / remote train split; no
        held-out retain split; an ``out_dir`` that exists and is not a directory, cannot be created
        or is not writable; a model without parameters or buffers when ``device`` is None; a model without
        trainable parameters (a registered method given); a model that cannot take a split's inputs or
        gives no (B, C) logits on it: `unlearn`'s message naming the split, `_checked_model`), TypeError (a model that is no `torch.nn.Module`; a config of another
        method; ``seeds`` not a sequence of integers, e.g. a bare int; a budget that is not a number; an
        ``out_dir`` that is not a path). Later: the other errors of the methods and metrics
        (ImportError without scikit-learn / scipy).
    Warns: `OverlappingSplitsWarning` once per call (not per run) when two train splits hold
        identical input rows. `MIAUndefinedWarning` once per call (not per run), naming every run
        scored in it (by this call, or by the ``--jobs`` workers of its ``session``; not the
        results reused from the cache) whose MIA-efficacy is undefined, and the splits.
    """
    from ._progress import progress_bar

    # one disjoint_scope for the whole comparison: its own check, every run and every scoring
    # check the splits; identical rows in two splits warn once per compare call. Likewise an MIA
    # attack without signal warns once per call (after the runs), not once per scored model.
    # θ0's evaluation before each run is made once per setting and seed and reused by the
    # runs after it (`original_eval_scope`: bit-identical runs; a --jobs worker keeps its own)
    with disjoint_scope(), mia_undefined_scope(), batch_warning_scope(), original_eval_scope():
        band = check_band(band)
        out_dir = expand_user(out_dir)   # "~/runs": the home directory, as the shell reads it
        seeds, specs, budget = _checked_arguments(
            splits, methods, seeds, configs=configs, setting=setting, variant=variant, hparams=hparams,
            model_fn=model_fn, retrain_recipe=retrain_recipe, relearn=relearn, batch_size=batch_size, budget=budget,
            mia_max_samples=mia_max_samples, original_only_ok=not write_tables)
        # one live comparison per out dir (OutDirInUseError otherwise); write_tables=False (the --jobs
        # workers) only adds to the per-run cache, atomically, under the lock of the parent
        from .unlearn.metrics import require_metric_dependencies
        require_metric_dependencies()   # before any run: MIA-efficacy needs scikit-learn
        device = _checked_model(model, splits, device, methods)   # before the lock, the fingerprint or any run
        with out_dir_lock(out_dir if write_tables else None):
            rl = _relearn_settings(relearn, model, splits, device, batch_size)
            metric_kw = {"relearn": rl, "mia_max_samples": mia_max_samples, "batch_size": batch_size}
            fp, cache = fingerprint(model, splits), ResultCache(out_dir, device)
            dtype = model_dtype(model)   # with the device, what an amp of "auto" runs as (its cache key)
            runs: Dict[str, Dict[int, dict]] = {s.name: {} for s in specs}
            retrained: Dict[int, dict] = {}   # seed -> Retrain's metrics (the gap metrics' reference)
            failures: Dict[str, Dict[int, str]] = {}
            reused: Dict[str, List[int]] = {}   # the (method, seed) results taken from the cache
            bar = progress_bar(total=len(specs) * len(seeds), desc="compare", enabled=progress)
            for spec in specs:
                hp = resolved_amp_fields(spec.hparams, device, dtype)
                for seed in seeds:
                    key = cache_key(CACHE_FORMAT, spec.name, seed, hp, fp, metric_kw)
                    bar.set_postfix_str(f"{spec.name} seed {seed}", refresh=False)
                    rec = cache.load(spec.name, seed, key)
                    if rec is None:
                        rec = _run_and_cache(spec, model, splits, seed, key, cache, device=device, session=session,
                                             metric_kw=metric_kw)
                    elif session is None or rec.get("session") != session:   # made before this invocation
                        reused.setdefault(spec.name, []).append(seed)
                    if rec.get("failed"):
                        failures.setdefault(spec.name, {})[seed] = rec["failed"]
                    elif spec.name == "retrain":
                        retrained[seed] = rec["metrics"]
                    runs[spec.name][seed] = rec["metrics"]
                    bar.update(1)
            bar.close()
            runs = {name: {seed: record_metrics(m, None if name == "retrain" else retrained.get(seed))
                           for seed, m in by_seed.items()} for name, by_seed in runs.items()}
            # the runs scored now (and by this session's workers); a --jobs worker (no tables) leaves it to the parent
            warn_undefined_mia(runs if write_tables else {}, skip=reused)
            order = [s.name for s in specs]
            summary = summarize(runs)
            table = format_markdown(summary, seeds=seeds, order=order, failures=failures, budget=budget, band=band)
            if reused:
                table += "\n\n" + cached_note(reused, cache.root)
            res = ComparisonResult(table=table, summary=summary, runs=runs, seeds=seeds, methods=order, relearn=rl,
                                   hparams={s.name: s.hparams for s in specs}, failures=failures, budget=budget,
                                   band=band)
            if out_dir is not None and write_tables:
                _write(res, Path(out_dir), fp)
            return res


def _checked_arguments(splits, methods, seeds, *, configs, setting, variant, hparams, model_fn, retrain_recipe,
                       relearn, batch_size, budget, mia_max_samples, original_only_ok=False):
    """`compare`'s checks before any run (its Raises): (the seeds as a list, the `MethodSpec` list,
    the budget as a float)."""
    if not isinstance(splits, Splits):
        raise TypeError("splits must be an entangle_ext.Splits")
    seeds = _seed_list(seeds)
    splits.check(("forget", "adjacent", "remote"), by="compare (its metrics are per split)")
    if splits.adjacent_test is None and splits.remote_test is None:
        raise ValueError("compare needs held-out retain data (adjacent_test / remote_test) for MIA-efficacy")
    budget = check_budget(budget)
    specs = build_specs(methods, configs=configs, setting=setting, variant=variant, hparams=hparams,
                        model_fn=model_fn, retrain_recipe=retrain_recipe, budget=budget, allow_empty=original_only_ok)
    stray = sorted(set(configs or {}) - {sp.name for sp in specs})
    if stray:
        raise ValueError(f"configs has entries for methods that are not compared: {stray} "
                         f"(compared: {[sp.name for sp in specs if sp.name != 'original']})")
    _check_relearn(relearn)
    check_batch_size(batch_size, "compare: batch_size")
    if mia_max_samples is not None and not (isinstance(mia_max_samples, int) and mia_max_samples >= 1):
        raise ValueError(f"compare: mia_max_samples must be None or an int >= 1, got {mia_max_samples!r}")
    return seeds, specs, budget


def _checked_model(model, splits: Splits, device, methods) -> torch.device:
    """`compare`'s checks of ``model`` on ``splits``, those `entangle_ext.unlearn` runs before any
    forward pass (`run_method`): a `torch.nn.Module` (TypeError), its device (`model_device`) and one
    probe batch of each split (`preflight`, in eval mode without gradients; the caller's train/eval
    flags are kept). A model that cannot take a split's inputs (another feature width, dict inputs
    its forward does not take) or gives no (B, C) logits is the ValueError naming the split that
    `unlearn` raises, before the fingerprint (which runs the model) and the relearn threshold; so is a
    model without trainable parameters when ``methods`` names a registered method (a str: it runs
    through `unlearn`, `require_trainable`). Returns the device, ``model`` moved there."""
    check_model_and_splits(model, splits, "compare")
    if any(isinstance(m, str) for m in ([methods] if isinstance(methods, (str, MethodSpec)) else methods)):
        require_trainable(model, copied=True)   # every method trains its own copy (copy_model)
    device = model_device(model, device)
    model.to(device)   # its train/eval flags stay: every evaluation sets eval mode and restores them
    with training_flags_kept(model):
        model.eval()
        preflight(model, splits, device)
    return device


def _run_and_cache(spec: MethodSpec, model, splits, seed: int, key: str, cache: ResultCache, *,
                   session: Optional[str] = None, **kw) -> dict:
    """One (method, seed) run, scored and cached (the record notes ``session``, `compare`'s); a run
    that diverges (`NonFiniteLossError`, or a model that cannot be scored) is a result too:
    recorded with its message under "failed"."""
    try:
        rec = {"key": key, **_run_one(spec, model, splits, seed, **kw)}
    except (NonFiniteLossError, _Diverged) as e:   # a diverging method is a result, not a crash
        rec = {"key": key, "method": spec.name, "seed": seed, "metrics": {}, "failed": str(e)}
    if session is not None:
        rec["session"] = session
    cache.save(spec.name, seed, rec)
    return rec


def _write(res: ComparisonResult, out: Path, fp: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res.paths = {"markdown": str(out / "comparison.md"), "json": str(out / "comparison.json"),
                 "png": str(out / "comparison.png")}
    again = "every run is cached: free space and rerun the same command to write the tables"
    atomic_write(res.paths["markdown"], lambda tmp: tmp.write_text(res.table + "\n"), what="comparison table",
                 hint=again)
    text = json.dumps(json_nan_free({**res.to_dict(), "fingerprint": fp}), indent=1, allow_nan=False)
    atomic_write(res.paths["json"], lambda tmp: tmp.write_text(text), what="comparison JSON", hint=again)
    if not plot_available(res.paths["png"]):
        del res.paths["png"]
        return
    plot_comparison(res.summary, res.paths["png"], order=res.methods)
