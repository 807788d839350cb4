"""How the flags of ``entangle-unlearn`` become the configuration of the chosen ``--method``
(entangle_ext.cli): the flag tables, ``--set KEY=VALUE``, the ``--hparams`` / ``--recipe`` pair and
the check that every flag given applies to the method. Everything here runs before any data is
loaded; bad input is a ValueError / TypeError whose message is the CLI's one error line."""
from __future__ import annotations

import ast
import copy
import dataclasses
import typing
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["OPTION_FLAGS", "STAGE_FLAGS", "RUN_FLAGS", "flag_tables", "flag_of", "check_option_flags", "parse_overrides",
           "hparams_and_recipe", "build_config", "check_conflicts", "has_stages", "named_recipe", "resume_check"]

OPTION_FLAGS = {"max_train_per_class": "data", "max_test_per_class": "data", "superclasses": "data",
                "forget": "data", "model_path": "data", "weights": "model"}
"""Flag destination → where `entangle_ext.settings.prepare` takes it (``data=`` or ``model=``)."""

STAGE_FLAGS = {"stage1_lr": ("stage1", ("lr",)), "stage1_epochs": ("stage1", ("epochs",)),
               "stage2_lr": ("stage2", ("lr",)), "epochs": ("stage2", ("epochs",)),
               "alpha": ("stage2", ("alpha",)), "micro_batch": ("stage2", ("micro_batch",)),
               "batch_limit": ("stage2", ("forget_batch_limit", "remote_batch_limit"))}
"""Flag destination → (stage, config fields it sets); two-stage family only."""

RUN_FLAGS = {"seed": ("top", "seed"), "log_every": ("top", "log_every"),
             "checkpoint_every": ("top", "checkpoint_every"), "deterministic": ("top", "deterministic"),
             "original_epochs": ("train", "epochs")}
"""Flag destination → the ``--set`` section and field it also sets (every method)."""


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def flag_tables(args):
    """(data options, model options, stage1 overrides, stage2 overrides) from the parsed flags."""
    opts = {"data": {}, "model": {}}
    for dest, kind in OPTION_FLAGS.items():
        if getattr(args, dest) is not None:
            opts[kind][dest] = getattr(args, dest)
    stages = {"stage1": {}, "stage2": {}}
    for dest, (stage, fields) in STAGE_FLAGS.items():
        if getattr(args, dest) is not None:
            stages[stage].update({f: getattr(args, dest) for f in fields})
    return opts["data"], opts["model"], stages["stage1"], stages["stage2"]


_FIELD_OWNERS = {"stage1": "Stage1Config", "stage2": "Stage2Config", "top": "UnlearnConfig", "train": "TrainRecipe"}


def flag_of(message: str, args) -> Optional[str]:
    """The flag (e.g. "--epochs") whose value a config check refused, when ``message`` starts with
    the field that flag sets ("Stage2Config.epochs must be ...") and the flag was typed (the
    parser's ``given_flags``; a flag left at its default, e.g. --log-every 10, set nothing: a
    ``--set`` did); else None. The commands put it in front of the message, which names the config
    field only."""
    pairs = [(dest, stage, f) for dest, (stage, fields) in STAGE_FLAGS.items() for f in fields] + \
            [(dest, section, field) for dest, (section, field) in RUN_FLAGS.items()]
    typed = getattr(args, "given_flags", None) or set()
    for dest, owner, field in pairs:
        if message.startswith(f"{_FIELD_OWNERS[owner]}.{field} ") and dest in typed:
            return flag_name(dest)
    return None


def check_option_flags(setting, given: Dict[str, Any]) -> None:
    """ValueError (one line naming the flag and the settings that take it) for a setting-option flag
    of `OPTION_FLAGS` given (not None) that ``setting`` does not take, e.g. ``--weights`` (the
    tinyimagenet / celeba ViT-B/32 backbone) or ``--model-path`` (toxigen's model) with digits.
    ``given``: {flag destination: value}; ``entangle-unlearn`` and ``entangle-unlearn compare``
    (which would otherwise ignore such a flag) both check their flags here."""
    from ..settings import SETTINGS

    for dest, value in given.items():
        if value is not None and dest not in setting.options:
            takers = [s.name for s in SETTINGS.values() if dest in s.options]
            raise ValueError(f"{flag_name(dest)} does not apply to setting {setting.name!r}; it applies to "
                             f"{', '.join(takers)} only")


def _literal(text: str) -> Any:
    words = {"true": True, "false": False, "none": None, "null": None}
    if text.strip().lower() in words:
        return words[text.strip().lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def has_stages(cls) -> bool:
    """True when the method's ``Config`` has the ``stage1`` / ``stage2`` fields (the two-stage
    family): the stage flags (`STAGE_FLAGS`) and ``--recipe`` apply to it."""
    names = {f.name for f in dataclasses.fields(cls.Config)}
    return {"stage1", "stage2"} <= names


def named_recipe(cls) -> bool:
    """True when the method's ``Config`` has a ``recipe`` field that names a recipe (a string, as
    the two-stage family's) rather than holding one (Retrain's `TrainRecipe` dataclass): it is
    chosen with ``--recipe`` / ``--hparams``, never with ``--set``."""
    hints = typing.get_type_hints(cls.Config)
    return "recipe" in hints and not dataclasses.is_dataclass(hints["recipe"])


def _sections(method: str) -> Tuple[type, Dict[str, type], List[str]]:
    """(the method's config class, {section: dataclass it sets} — ``train`` (the original model's
    `TrainRecipe`) and every dataclass-valued field of the config (stage1 / stage2, Retrain's
    recipe) — and the top-level field names)."""
    from ..unlearn.method import get_method
    from ..train import TrainRecipe

    cls = get_method(method)
    hints = typing.get_type_hints(cls.Config)
    nested = {f.name: hints[f.name] for f in dataclasses.fields(cls.Config) if dataclasses.is_dataclass(hints[f.name])}
    top = [f.name for f in dataclasses.fields(cls.Config)
           if f.name not in nested and not (f.name == "recipe" and named_recipe(cls))]
    return cls, {**nested, "train": TrainRecipe}, top


def parse_overrides(items: List[str], method: str = "two_stage") -> Dict[str, Dict[str, Any]]:
    """``--set`` items → {section: {field: value}}: "top" (fields of the method's config: a
    top-level `UnlearnConfig` field, or a baseline's own ``Config`` field), "train" (the original
    model's `TrainRecipe`) and one section per dataclass-valued config field ("stage1" / "stage2"
    of the two-stage family, "recipe" of Retrain). Raises ValueError for an unknown method, a
    malformed item or a field the method's config does not have (the message lists the known ones)."""
    cls, known, top = _sections(method)
    out: Dict[str, Dict[str, Any]] = {"top": {}, **{s: {} for s in known}}
    first: Dict[Tuple[str, str], str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. stage2.lr=1e-4")
        if key == "recipe" and named_recipe(cls):
            raise ValueError(f"--set {item!r}: use --recipe or --hparams (they switch the recipe's fields together)")
        section, dot, name = key.partition(".")
        if not dot:
            section, name = "top", key
        fields = top if section == "top" else \
            [f.name for f in dataclasses.fields(known[section])] if section in known else None
        if fields is None or name not in fields:
            where = f"{known[section].__name__} field {name!r}" if section in known else f"key {key!r}"
            choices = f"{fields}" if section in known else \
                ", ".join(f"{s}.*" for s in known) + f" or {cls.Config.__name__} fields {top}"
            raise ValueError(f"--set {item!r}: unknown {where} for method {method!r}; choose from {choices}")
        value = _literal(value)
        if name in out[section] and out[section][name] != value:
            raise ValueError(f"--set {first[(section, name)]!r} and --set {item!r} set one field to two values; "
                             "give it once")
        first.setdefault((section, name), item)
        out[section][name] = value
    return out


def check_conflicts(args, sets: Dict[str, Dict[str, Any]], given: Optional[set] = None) -> None:
    """ValueError (one line naming both) when a flag and a ``--set`` item set one field to two
    values, e.g. ``--stage2-lr 5e-4 --set stage2.lr=1e-3`` or ``--batch-limit 2 --set
    stage2.forget_batch_limit=3``. ``given``: the flag destinations typed on the command line (so
    a flag left at its default does not conflict); None = every flag whose value is not None."""
    def typed(dest):
        return getattr(args, dest, None) is not None if given is None else dest in given

    pairs = [(dest, stage, f) for dest, (stage, fields) in STAGE_FLAGS.items() for f in fields]
    pairs += [(dest, section, f) for dest, (section, f) in RUN_FLAGS.items()]
    for dest, section, f in pairs:
        if not typed(dest) or f not in sets.get(section, {}):
            continue
        flag, other = getattr(args, dest), sets[section][f]
        if flag != other:
            key = f if section == "top" else f"{section}.{f}"
            value = "" if isinstance(flag, bool) else f" {flag}"
            raise ValueError(f"{flag_name(dest)}{value} and --set {key}={other!r} set {key} to two values; "
                             "give one of them")


def hparams_and_recipe(method: str, hparams: Optional[str], recipe: Optional[str]) -> Tuple[str, Optional[str]]:
    """(hparams family, two-stage recipe or None for a baseline) from ``--hparams`` / ``--recipe``
    (None = not given). For the two-stage family the two name one choice (paper_code = reference,
    original = paper, docs/algorithm.md §7); a baseline takes ``--hparams`` only. ValueError when
    ``--recipe`` is given to a baseline or disagrees with ``--hparams``."""
    from ..unlearn.method import get_method
    from ..unlearn.config import RECIPE_OF_HPARAMS

    if recipe is None:
        h = hparams or "paper_code"
        return h, RECIPE_OF_HPARAMS[h] if has_stages(get_method(method)) else None
    if not has_stages(get_method(method)):
        raise ValueError(f"--recipe does not apply to method {method!r} (a baseline); choose its preset with "
                         "--hparams paper_code|original")
    implied = {r: h for h, r in RECIPE_OF_HPARAMS.items()}[recipe]
    if hparams is not None and hparams != implied:
        raise ValueError(f"--recipe {recipe} and --hparams {hparams} disagree: for the two-stage family --hparams "
                         f"paper_code runs --recipe reference and original runs --recipe paper; give one of them")
    return implied, recipe


def build_config(args, setting, variant, stage_flags: Dict[str, Dict[str, Any]], sets: Dict[str, Dict[str, Any]],
                 train: Dict[str, Any]) -> Tuple[Any, str]:
    """(the validated config that ``entangle_ext.unlearn(..., method=args.method)`` gets, the
    hparams family it comes from).

    Two-stage family: `Setting.config` of ``variant`` in the recipe of ``--hparams`` / ``--recipe``
    with the stage flags, ``--set`` and the run flags; a flag or ``--set`` field that the method
    itself rewrites or whose stage it skips (e.g. ``--alpha`` with no_w2) is a ValueError.
    Baseline: the method's ``resolve_config`` (``entangle_ext/unlearn/method.py``: its
    ``--hparams`` preset for the setting; Retrain's paper_code recipe is the one the original model
    is trained with, ``--original-epochs`` and ``--set train.*`` included) with ``--set`` and the
    run flags, as `entangle_ext.compare` resolves it too; any stage flag is a ValueError."""
    cls, (hparams, recipe) = _sections(args.method)[0], hparams_and_recipe(args.method, args.hparams, args.recipe)
    run = dict(seed=args.seed, log_every=args.log_every, checkpoint_every=args.checkpoint_every)
    if has_stages(cls):
        top = {**run, "deterministic": args.deterministic, **sets["top"]}
        cfg = setting.config(variant, recipe=recipe, stage1=stage_flags["stage1"],
                             stage2=stage_flags["stage2"], **top)
        for stage in ("stage1", "stage2"):   # --set may also set None (e.g. stage2.micro_batch=none)
            if sets[stage]:
                setattr(cfg, stage, dataclasses.replace(getattr(cfg, stage), **sets[stage]))
        _check_rewrites(cls, cfg.validate(), _given(args, sets))
        return cfg, hparams
    given = [flag_name(d) for d in STAGE_FLAGS if getattr(args, d) is not None]
    if given:
        raise ValueError(f"{given[0]} does not apply to method {args.method!r} (a baseline: the stage flags "
                         f"configure the two-stage family); set its fields with --set FIELD=VALUE, one of "
                         f"{_sections(args.method)[2]}")
    # Retrain's paper_code recipe is the original model's (the variant's, with --original-epochs /
    # --set train.*, but not train.channels_last: Retrain trains under the run's --set
    # channels_last); every other baseline starts from its --hparams preset (config None)
    paper_retrain = args.method == "retrain" and hparams == "paper_code"
    cfg = cls.Config(recipe=variant.recipe.replace(**{k: v for k, v in train.items() if k != "channels_last"})) \
        if paper_retrain else None
    cfg = cls.resolve_config(cfg, setting.name, hparams).validate()
    nested = {s: dataclasses.replace(getattr(cfg, s), **v) for s, v in sets.items() if s not in ("top", "train") and v}
    amp = cfg.amp if cfg.amp is not None else variant.amp   # the variant's autocast (Variant.amp)
    return cfg.replace(**{**run, "amp": amp, **sets["top"], **nested}).validate(), hparams


def _given(args, sets) -> Dict[Tuple[str, str], str]:
    """{(section, field): how the user set it} for the stage flags and ``--set`` of the config."""
    out = {(stage, f): flag_name(dest) for dest, (stage, fields) in STAGE_FLAGS.items()
           if getattr(args, dest) is not None for f in fields}
    for section in ("top", "stage1", "stage2"):
        for name, value in sets[section].items():
            out[(section, name)] = f"--set {name if section == 'top' else f'{section}.{name}'}={value!r}"
    return out


def _check_rewrites(cls, cfg, given: Dict[Tuple[str, str], str]) -> None:
    """ValueError for a user-set field that ``cls.transform`` changes, or that belongs to a stage
    the method skips (e.g. Stage 1 fields for pgd_mean)."""
    after = cls.transform(copy.deepcopy(cfg))
    for (section, name), label in given.items():
        stage = {"stage1": 1, "stage2": 2}.get(section)
        if stage and getattr(cfg, f"run_stage{stage}") and not getattr(after, f"run_stage{stage}"):
            raise ValueError(f"{label} does not apply to method {cls.name!r}: it runs no Stage {stage}")
        was, now = (getattr(getattr(c, section) if stage else c, name) for c in (cfg, after))
        if was != now:
            where = f"{section}.{name}" if stage else name
            raise ValueError(f"{label} does not apply to method {cls.name!r}: it sets {where} = {now!r}")


def resume_check(ckpt: Optional[dict], flag: str) -> Optional[Callable]:
    """For `entangle_ext.settings.prepare`'s ``before_training``: a ``--resume`` checkpoint whose
    splits or model do not fit the loaded data and the freshly built model is refused (ValueError
    naming ``flag``, e.g. "--resume runs/x") before the original model is trained, which can take
    hours; a checkpoint of another setting used to be noticed only after that training. None
    without a checkpoint."""
    if ckpt is None:
        return None

    def check(model, fingerprint) -> None:
        from ..unlearn.checkpoint import check_resume
        from ..unlearn.inputs import check_resume_model
        try:   # the splits (the config was checked before any data, with --allow-config-change's say)
            check_resume(ckpt, fingerprint, ckpt.get("config", {}), allow_config_change=True)
            check_resume_model(ckpt, model)
        except ValueError as e:
            raise ValueError(f"{flag}: {e} (was it written by a run of another --setting, --variant or data "
                             "flags? Resume with that run's flags)") from None
    return check


def check_resumed_original(ckpt: Optional[dict], model, flag: str) -> bool:
    """With ``--resume``: whether ``model``, the original model this command trained or loaded, is
    the one the checkpoint's run started from (its ``done["original_state"]``, `original_state`; a
    checkpoint without it, or a sharded model, counts as the same). When it is not, a `UserWarning`
    naming ``flag``: a resumed run goes on from the checkpoint, its original model's evaluations
    included, so another ``--original`` / ``--original-epochs`` / ``--set train.*`` / ``--seed``
    changed nothing, and an original retrained elsewhere (another ``--out``, device or version, on
    hardware that does not train bit-reproducibly) is not the run's either; the caller then records
    no original-model file or recipe in report.json (they would name a model nothing used)."""
    from ..unlearn.fingerprint import original_state
    want = ((ckpt or {}).get("done") or {}).get("original_state")
    got = None if want is None else original_state(model)
    if got is None or got == want:
        return True
    warnings.warn(f"{flag}: the original model this command made or loaded is not the one the checkpoint's run "
                  "started from (other --original / --original-epochs / --set train.* / --seed flags, or one "
                  "trained anew for another --out, device or version): the run goes on from the checkpoint, with "
                  "that run's original-model evaluations; report.json names no original-model file or recipe",
                  UserWarning, stacklevel=2)
    return False
