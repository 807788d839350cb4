"""Checkpoint selection among the curve probes, ``select="first_within"`` (docs/algorithm.md
"Curves, certificate and stopping rules (ours)"; not in the paper or the reference code): the
run returns the first probed state whose forget train-subsample accuracy is within a bound and
whose adjacent / remote ones stayed within δ of the original model's, instead of its final
state. Works for every method: `Run` (``entangle_ext/unlearn/run.py``) hands every probe record
of every stage to `StateSelection.observe`."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from .curves import SelectionWarning, first_within_rule, require_origin, stage_label
from .files import atomic_write
from .module_state import state_module, unwrapped_state
from .sharded import has_dtensor

__all__ = ["StateSelection", "check_unchanged", "selection_line", "SELECTION_FIELDS", "MODEL_FILE"]

#: The config fields of the selection; a resume may not change them (`StateSelection`).
SELECTION_FIELDS = ("select", "select_forget_acc", "select_delta")
#: The kept state under out_dir: a plain state dict (`torch.save(model.state_dict())`; of a compiled
#: model, its module's: `state_module`, so it loads into the plain model).
MODEL_FILE = "selected_model.pt"


class StateSelection:
    """The selection of one run.

    Args:
        config: the run's config (``select``, ``select_forget_acc``, ``select_delta``).
        num_classes: C (the forget bound's default is 1/C, chance level).
        done: the run's ``done`` dict (in every checkpoint): ``done["selected"]`` = {"stage",
            "step", "global_step"} of the kept state.
        common: the checkpointer's common entries: ``common["selected_model"]`` = the kept state
            dict (CPU tensors), so every checkpoint written after the choice carries it.
        ckpt: the checkpoint resumed from ({} for none); its kept state is carried over.
        model: the run's model. (A resume that changes `SELECTION_FIELDS` is refused before, by
            `check_unchanged`, which `Run` calls for every run.)
    Raises:
        ValueError: the checkpoint names a kept state but lacks it; NotImplementedError: a
            sharded (FSDP, DTensor) model.
    """

    def __init__(self, config, num_classes: int, done: Dict[str, Any], common: Dict[str, Any],
                 ckpt: Dict[str, Any], model: torch.nn.Module):
        self.config, self.num_classes, self.done, self.common = config, int(num_classes), done, common
        self._rule: Optional[Callable[[Dict[str, Any]], bool]] = None
        if done.get("selected") is not None and "selected_model" not in ckpt:
            raise ValueError("resume: the checkpoint names a kept state (select) but does not hold it; "
                             "start a new run")
        if has_dtensor(model.state_dict()):
            raise NotImplementedError(f"select={config.select!r} does not support sharded (FSDP) models: its "
                                      "kept state would be one rank's shards; run without select")
        if "selected_model" in ckpt:
            common["selected_model"] = ckpt["selected_model"]

    @property
    def bounds(self) -> Dict[str, float]:
        """{"forget_acc_max", "delta"} (fractions)."""
        bound = self.config.select_forget_acc
        return {"forget_acc_max": 1.0 / self.num_classes if bound is None else float(bound),
                "delta": float(self.config.select_delta)}

    def observe(self, rec: Dict[str, Any], model: torch.nn.Module, origin: Optional[Dict[str, Any]]) -> None:
        """One probe record ``rec`` of a stage, ``model`` still at that state, ``origin`` the
        original model's record: until a state is kept, keep a CPU copy of ``model``'s state when
        ``rec`` meets `first_within_rule`. Raises ValueError without ``origin`` (a resume of a
        checkpoint written with curves off)."""
        if self.done.get("selected") is not None:
            return
        if self._rule is None:
            self._rule = first_within_rule(require_origin(origin, f"select={self.config.select!r}"), **self.bounds)
        if self._rule(rec):
            self.done["selected"] = {"stage": stage_label(rec["stage"]), "step": rec["step"],
                                     "global_step": rec["global_step"]}
            self.common["selected_model"] = {k: v.detach().to("cpu", copy=True) for k, v in state_module(model).state_dict().items()}

    def restore(self, model: torch.nn.Module) -> bool:
        """After the method's stages: load the kept state into ``model`` and return True, or warn
        (`SelectionWarning`) that no probed state was within the bounds and return False (the
        model keeps its final state)."""
        if self.done.get("selected") is None:
            b = self.bounds
            warnings.warn(f"select={self.config.select!r}: no probed state had forget train accuracy <= "
                          f"{100 * b['forget_acc_max']:.1f}% with adjacent/remote train accuracy within "
                          f"{100 * b['delta']:.1f} points of the original's; the run returns its final state",
                          SelectionWarning, stacklevel=4)
            return False
        state_module(model).load_state_dict(unwrapped_state(self.common["selected_model"]))
        return True

    def save(self, out_dir: Path) -> Optional[str]:
        """The kept state as ``out_dir/selected_model.pt`` (a plain state dict, atomically; for
        ``--original`` or `entangle_ext.train.load_model_file`); its path, None when none is kept.
        The checkpoints' ``"model"`` entries stay the stages' own end states."""
        if self.done.get("selected") is None:
            return None
        state = self.common["selected_model"]
        return str(atomic_write(Path(out_dir) / MODEL_FILE, lambda tmp: torch.save(state, tmp), what="selected model"))

    def entry(self) -> Dict[str, Any]:
        """The report's ``selected`` entry: {"rule", "forget_acc_max", "delta", "kept" ("selected"
        or "final"), "stage", "step", "global_step" (None when none was kept), "model_file" (None
        until `save` wrote it)}."""
        at = self.done.get("selected") or {"stage": None, "step": None, "global_step": None}
        return {"rule": self.config.select, **self.bounds, "kept": "final" if at["stage"] is None else "selected",
                **at, "model_file": None}


def check_unchanged(changes: Optional[Dict[str, Any]]) -> None:
    """ValueError when the config differences a resume accepted (`check_resume`: {field: [checkpoint
    value, new value]}) touch `SELECTION_FIELDS`, whatever ``allow_config_change``: the kept state
    is the first within the bounds over every probe since the run began, and a resumed process
    no longer has the states before its checkpoint (turning ``select`` off is refused too, as the
    checkpoints written after it would name a kept state they no longer hold)."""
    changed = sorted(k for k in (changes or {}) if k in SELECTION_FIELDS)
    if changed:
        raise ValueError(f"resume: {', '.join(changed)} cannot change on resume (checkpoint vs now: "
                         f"{'; '.join(f'{k} {changes[k][0]!r} vs {changes[k][1]!r}' for k in changed)}), not "
                         "even with allow_config_change: the kept state is the first within the bounds over "
                         "every probe since the run began, and the states before the checkpoint are gone. "
                         "Resume with the checkpoint's values, or start a new run")


def selection_line(sel: Dict[str, Any]) -> str:
    """The table's footer line for the report's ``selected`` entry: the state kept, or that none
    was within the bounds."""
    bounds = f"forget ≤ {100 * sel['forget_acc_max']:.1f}%, kept within {100 * sel['delta']:.1f} pts"
    if sel["stage"] is None:
        return f"selected ({sel['rule']}: {bounds}): no probed state within; the final state is kept"
    return f"selected ({sel['rule']}: {bounds}): {sel['stage']} step {sel['step']} (global step {sel['global_step']})"
