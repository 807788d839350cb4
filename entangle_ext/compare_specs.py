"""What `entangle_ext.compare` runs: a `MethodSpec` per compared method, each registered method's
config as ``entangle_ext.unlearn(..., method=name)`` would resolve it (`method_config`,
`effective_config`), the comparison's common budget (`scale_budget`) and the checks of the method
names. ``entangle_ext/compare.py`` re-exports every public name here."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .unlearn.entry import unlearn
from .unlearn.report import UnlearnResult
from .unlearn.config import RECIPE_OF_HPARAMS, UnlearnConfig
from .unlearn.fingerprint import model_fingerprint
from .compare_cache import jsonable

__all__ = ["MethodSpec", "method_spec", "model_fn_key", "method_config", "effective_config", "scale_budget", "check_budget",
           "check_method_names", "available_methods", "original_spec", "build_specs"]


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


def available_methods() -> List[str]:
    """Names `compare` can run: `entangle_ext.methods.available_methods()` (the baselines, then
    the two-stage family)."""
    return list(_methods().available_methods())


def _methods():
    from . import methods   # lazy: the registry imports the settings and every method module
    return methods


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

    A variant with an ``amp`` (`entangle_ext.settings.Variant.amp`, e.g. "auto" on
    ``cifar100`` / ``cpu``) gives it to every method: the two-stage family through
    `Setting.config`, each baseline (Retrain included) as its config above with that ``amp``
    instead of None.

    Raises ValueError for an unknown method, setting (one without a preset of the method),
    variant (also a variant without a registered setting) or hparams, also when ``config`` is given.
    """
    M = _methods()
    cls = M.get_method(name)
    cls.check_arguments(setting, hparams)   # hparams, and a setting this method has a preset for
    from .settings import SETTINGS
    if variant is not None and setting not in SETTINGS:
        raise ValueError(f"variant {variant!r} needs a registered setting (one of {sorted(SETTINGS)}), "
                         f"got setting={setting!r}")
    if config is not None:
        return config
    v = SETTINGS[setting].variant(variant) if setting in SETTINGS else None
    amp = None if v is None else v.amp   # the variant's autocast (Variant.amp)
    if name == "retrain":
        if retrain_recipe is None and v is not None and hparams == "paper_code":
            retrain_recipe = v.recipe
        if retrain_recipe is None:
            return None if amp is None else cls.config_for(setting, hparams, amp=amp)
        return cls.Config(recipe=retrain_recipe, amp=amp)
    if issubclass(cls.Config, UnlearnConfig) and v is not None:   # the two-stage family
        return SETTINGS[setting].config(v, recipe=RECIPE_OF_HPARAMS[hparams])
    return None if amp is None else cls.config_for(setting, hparams, amp=amp)


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
    eff = jsonable(effective_config(name, copy.deepcopy(cfg), setting=setting, hparams=hparams))
    eff.pop("seed", None)

    def run(model, splits, *, seed, device, progress):
        return unlearn(model, splits, copy.deepcopy(cfg), method=name, setting=setting, hparams=hparams,
                       model_fn=model_fn if name == "retrain" else None, seed=seed, device=device,
                       progress=progress)

    hp = {"config": eff, "setting": setting, "variant": variant, "hparams": hparams}
    if budget != 1.0:   # (absent at 1: the cache keys of full-budget runs stay as they were)
        hp["budget"] = budget
    if name == "retrain":   # what builds the fresh model
        hp["model_fn"] = model_fn_key(model_fn)
    return MethodSpec(name, run, hp)


def model_fn_key(model_fn: Optional[Callable[[], torch.nn.Module]]) -> Optional[dict]:
    """What a comparison's cache knows Retrain's ``model_fn`` by: its name (module.qualname) and
    the model it builds with the global generator seeded 0 (the generators' states are restored
    after): the module tree (``repr``) and `model_fingerprint`'s class and state dict. A name alone
    is "functools.partial" for every partial and "__main__.<lambda>" for every lambda of a script:
    another builder under such a name reused the old Retrain rows (and the gaps to them).

    Raises TypeError when ``model_fn()`` does not return a ``torch.nn.Module``."""
    if model_fn is None:
        return None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn must return a torch.nn.Module, got {type(model).__name__}")
    name = f"{getattr(model_fn, '__module__', '')}.{getattr(model_fn, '__qualname__', type(model_fn).__name__)}"
    return {"name": name, "modules": hashlib.sha256(repr(model).encode()).hexdigest()[:16], **model_fingerprint(model)}


def original_spec() -> MethodSpec:
    return MethodSpec("original", lambda model, splits, **_: UnlearnResult(model=model, report={}), {})


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


def build_specs(methods, *, configs, allow_empty: bool = False, **kw) -> List[MethodSpec]:
    if isinstance(methods, (str, MethodSpec)):
        methods = [methods]
    specs = [m if isinstance(m, MethodSpec) else method_spec(m, config=(configs or {}).get(m), **kw)
             for m in methods]
    if specs or not allow_empty:   # allow_empty: the original's row alone (a --jobs worker's first task)
        check_method_names([s.name for s in specs])
    retrain = [s for s in specs if s.name == "retrain"]
    return retrain + [original_spec()] + [s for s in specs if s.name != "retrain"]
