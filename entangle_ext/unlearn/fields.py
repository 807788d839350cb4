"""Typed-field checks of the configuration dataclasses (`UnlearnConfig`, `Stage1Config`,
`Stage2Config`, every method's `MethodConfig`): a value must fit its annotation (``int``,
``float``, ``Optional``, ``Literal`` choices, ``Union``), and range rules name the field."""
from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from typing import Literal

__all__ = ["check_fields", "require", "at_least", "StrictFields", "Select", "check_curve_fields", "check_seed",
           "check_stage_switches", "SEED_MIN", "SEED_MAX", "MOMENTUM_RULE", "HISTOGRAM_BINS_MAX", "HISTOGRAM_BINS_RULE", "field_values"]

Select = typing.Optional[Literal["first_within"]]   # checkpoint selection (None: keep the final state)


class StrictFields:
    """Base of the configuration dataclasses: setting an attribute that is not one of the class's
    dataclass fields (``cfg.stage2.alhpa = 0.3``) raises AttributeError naming the closest field,
    instead of adding an attribute that nothing reads. Field values are checked as before (at
    construction and at the entry of `entangle_ext.unlearn`)."""
    __slots__ = ()

    def __setattr__(self, name, value):
        names = _field_names(type(self))
        if name not in names:
            import difflib
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"{type(self).__name__} has no field {name!r}{hint} (fields: "
                                 f"{', '.join(sorted(names))})")
        object.__setattr__(self, name, value)


def field_values(cls, d, where: str, hint: str = "") -> dict:
    """``d`` as a dict of ``cls``'s dataclass fields (a copy), for ``cls(**...)``: TypeError when it
    is not a mapping (e.g. a list of pairs, None); ValueError naming the unknown keys, the closest
    field and all of them (``hint`` appended, e.g. where stage fields go). ``where`` names the
    caller, e.g. "UnlearnConfig.from_dict"."""
    import collections.abc
    if not isinstance(d, collections.abc.Mapping):
        raise TypeError(f"{where} takes a dict of {cls.__name__} fields, got {type(d).__name__} {d!r:.80}")
    names = _field_names(cls)
    unknown = sorted(str(k) for k in d if k not in names)
    if unknown:
        import difflib
        close = difflib.get_close_matches(unknown[0], names, n=1)
        near = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{where}: unknown {cls.__name__} field(s) {unknown}{near}; its fields: "
                         f"{', '.join(sorted(names))}{hint}")
    return dict(d)


def _field_names(cls) -> frozenset:
    names = cls.__dict__.get("_strict_field_names")
    if names is None:
        names = frozenset(f.name for f in dataclasses.fields(cls))
        type.__setattr__(cls, "_strict_field_names", names)
    return names


def _matches(value, hint, finite: bool = True) -> bool:
    """Does ``value`` fit the annotation ``hint`` (bool, int, float, str, Optional, Literal,
    Tuple[...] or a config dataclass)? ``finite=False``: a NaN / ±Inf fits a float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return any(value == c and _matches(value, type(c)) for c in args)
    if origin is typing.Union:
        return any(_matches(value, a, finite) for a in args)
    if origin is tuple:
        return isinstance(value, (tuple, list)) and len(value) == len(args) and \
            all(_matches(v, a, finite) for v, a in zip(value, args))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return False   # (an integer fits: `_sized` makes it a float, or refuses one beyond the float range)
        return isinstance(value, numbers.Integral) or math.isfinite(value) or not finite
    return isinstance(value, hint)


def _choices(hint) -> tuple:
    """The allowed values of a Literal (or Optional[Literal]) annotation; () otherwise."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        lits = [a for a in args if typing.get_origin(a) is Literal]
        if lits and len(lits) == len(args):   # not e.g. int or "auto": a type error then
            none = (None,) if type(None) in typing.get_args(hint) else ()
            return none + tuple(c for a in lits for c in typing.get_args(a))
    return ()


def _hint_name(hint) -> str:
    """A readable name of an annotation: "int", "None", "'auto'", "int or 'auto' or None",
    "(float, float)"."""
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(c) for c in typing.get_args(hint))
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_hint_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return "(" + ", ".join(_hint_name(a) for a in typing.get_args(hint)) + ")"
    return getattr(hint, "__name__", str(hint))


def _members(hint) -> set:
    """The plain types an annotation is made of (through Optional/Union and Tuple)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, tuple):
        return set().union(*(_members(a) for a in args))
    return {hint}


def _expected(hint, value) -> str:
    """What a field of annotation ``hint`` accepts, in words that are true for ``value``: a float
    field takes a finite int or float; an int field no float, not even a whole one (2.0 → 2)."""
    parts, members = [_hint_name(hint)], _members(hint)
    if float in members:
        parts.append("(finite: NaN/Inf are refused)")
    if int in members and float not in members and isinstance(value, float):
        whole = math.isfinite(value) and value.is_integer()
        parts.append(f"(an integer: write {int(value)}, not {value!r})" if whole else "(an integer, not a float)")
    return " ".join(parts)


def _plain(value):
    """A numeric scalar of another type (numpy, a bool excepted) as the built-in int or float of
    its value; anything else unchanged."""
    if isinstance(value, bool) or type(value) in (int, float) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


INT64_MAX = 2 ** 63 - 1


def _sized(value, hint, where: str, name: str):
    """An int in a float field as the float of its value (torch takes 10**30 as an int64 and
    fails mid-run: "int too big to convert"); ValueError for an int beyond the float range, and
    for an int in an int field beyond torch's int64 (a batch size of 10**30 failed inside
    torch.split); the seed has its own range (`check_seed`)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    members = _members(hint)
    if float in members and int not in members:
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{where} must be a finite float, got an integer of {len(str(abs(value)))} "
                             "digits (beyond the float range)") from None
    if int in members and name != "seed" and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"{where} must be at most 2**63 - 1 in size (torch's int64), got an integer of "
                         f"{len(str(abs(value)))} digits")
    return value


def check_fields(cfg) -> None:
    """TypeError for a field whose value does not fit its annotation; ValueError for a value
    outside a Literal's choices (a recipe switch) and for a NaN / ±Inf where a float goes (a
    value of the right type that no range admits), an int beyond the float range in a float field
    or beyond torch's int64 in an int field (`_sized`). A numeric field given a numpy scalar holds
    the built-in int / float of its value afterwards (so the config serialises to JSON), a float
    field given a Python int its float."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, hint = getattr(cfg, f.name), hints[f.name]
        where = f"{type(cfg).__name__}.{f.name}"
        if _matches(value, hint):
            plain = _sized(_plain(value), hint, where, f.name)
            if plain is not value:   # e.g. numpy.float32(0.5) -> 0.5: configs go to JSON as they are
                object.__setattr__(cfg, f.name, plain)
            continue
        choices = _choices(hint)
        if choices:
            raise ValueError(f"{where} must be one of {choices}, got {value!r}")
        if _matches(value, hint, finite=False):
            raise ValueError(f"{where} must be finite (NaN/Inf are refused), got {value!r}")
        raise TypeError(f"{where} must be {_expected(hint, value)}, got {value!r} ({type(value).__name__})")


def require(cfg, ok: bool, name: str, rule: str) -> None:
    if not ok:
        raise ValueError(f"{type(cfg).__name__}.{name} must be {rule}, got {getattr(cfg, name)!r}")


def at_least(cfg, lo, *names: str) -> None:
    for n in names:
        require(cfg, getattr(cfg, n) >= lo, n, f">= {lo}")


#: The rule of every momentum field (Stage 2's heavy ball, the baselines' and the training's SGD).
MOMENTUM_RULE = "in [0, 1) (a momentum of 1 or more lets the velocity grow without bound)"

#: The most bins of the forget-loss histogram (``histogram_bins``): more draws nothing readable,
#: and a million took minutes and gigabytes.
HISTOGRAM_BINS_MAX = 10_000
HISTOGRAM_BINS_RULE = f"an integer in [1, {HISTOGRAM_BINS_MAX}] (bins of the forget-loss histogram)"

#: The seeds `torch.manual_seed` takes (a run config's ``seed``, `entangle_ext.compare`'s seeds).
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1


def check_seed(cfg) -> None:
    """ValueError naming the field unless ``cfg.seed`` lies in [`SEED_MIN`, `SEED_MAX`] (else
    torch.manual_seed would fail with "Overflow when unpacking long long" once the run starts)."""
    require(cfg, SEED_MIN <= cfg.seed <= SEED_MAX, "seed", f"in [{SEED_MIN}, {SEED_MAX}] (torch.manual_seed's range)")


def check_curve_fields(cfg) -> None:
    """Ranges of the curve and checkpoint-selection fields every run config has (`UnlearnConfig`,
    `MethodConfig`): eval_every >= 0, curve_samples >= 1, select_forget_acc None or in [0, 1],
    select_delta in [0, 1], and ``select`` needs eval_every > 0 (it picks among the curve
    probes). Raises ValueError naming the field."""
    at_least(cfg, 1, "curve_samples")
    at_least(cfg, 0, "eval_every")
    require(cfg, cfg.select_forget_acc is None or 0 <= cfg.select_forget_acc <= 1, "select_forget_acc",
            "None or in [0, 1]")
    require(cfg, 0 <= cfg.select_delta <= 1, "select_delta", "in [0, 1]")
    if cfg.select is not None and cfg.eval_every == 0:
        raise ValueError(f"{type(cfg).__name__}.select={cfg.select!r} picks among the curve probes: it needs "
                         "eval_every > 0 (steps between probes), got eval_every=0")


def check_stage_switches(cfg) -> None:
    """`UnlearnConfig`'s stage switches and stopping rules: ValueError when ``run_stage1`` and
    ``run_stage2`` are both False (nothing would run) or a stage's ``until`` is set with
    eval_every == 0 (a stopping rule is checked at the curve probes)."""
    if not (cfg.run_stage1 or cfg.run_stage2):
        raise ValueError("run_stage1 and run_stage2 are both False: nothing would run; leave at least one stage on")
    for name, until in (("stage1.until", cfg.stage1.until), ("stage2.until", cfg.stage2.until)):
        if until is not None and cfg.eval_every == 0:
            raise ValueError(f"UnlearnConfig.{name}={until!r} is a stopping rule checked at the curve "
                             "probes: it needs eval_every > 0 (steps between probes), got eval_every=0")
