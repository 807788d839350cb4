"""Checkpoint selection among the curve probes, ``select="first_within"`` (docs/algorithm.md
"Curves, certificate and stopping rules (ours)"; not in the paper or the reference code): the
run returns the first probed state whose forget train-subsample accuracy is within a bound and
whose adjacent / remote ones stayed within δ of the original model's, instead of its final
state. Works for every method: `Run` (``entangle_ext/unlearn/run.py``) hands every probe record
of every stage to `StateSelection.observe`."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Optional

import torch

from .curves import SelectionWarning, first_within_rule

__all__ = ["StateSelection", "selection_line"]


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
    """

    def __init__(self, config, num_classes: int, done: Dict[str, Any], common: Dict[str, Any],
                 ckpt: Dict[str, Any]):
        self.config, self.num_classes, self.done, self.common = config, int(num_classes), done, common
        self._rule: Optional[Callable[[Dict[str, Any]], bool]] = None
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
            if origin is None:
                raise ValueError(f"select={self.config.select!r} compares with the original model's curve "
                                 "record, which this run lacks: it resumed a checkpoint written with "
                                 "eval_every=0; restart the run with eval_every > 0")
            self._rule = first_within_rule(origin, **self.bounds)
        if self._rule(rec):
            stage = rec["stage"]
            self.done["selected"] = {"stage": f"stage{stage}" if isinstance(stage, int) else str(stage),
                                     "step": rec["step"], "global_step": rec["global_step"]}
            self.common["selected_model"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

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
        model.load_state_dict(self.common["selected_model"])
        return True

    def entry(self) -> Dict[str, Any]:
        """The report's ``selected`` entry: {"rule", "forget_acc_max", "delta", "kept" ("selected"
        or "final"), "stage", "step", "global_step" (None when none was kept)}."""
        at = self.done.get("selected") or {"stage": None, "step": None, "global_step": None}
        return {"rule": self.config.select, **self.bounds, "kept": "final" if at["stage"] is None else "selected",
                **at}


def selection_line(sel: Dict[str, Any]) -> str:
    """The table's footer line for the report's ``selected`` entry: the state kept, or that none
    was within the bounds."""
    bounds = f"forget ≤ {100 * sel['forget_acc_max']:.1f}%, kept within {100 * sel['delta']:.1f} pts"
    if sel["stage"] is None:
        return f"selected ({sel['rule']}: {bounds}): no probed state within; the final state is kept"
    return f"selected ({sel['rule']}: {bounds}): {sel['stage']} step {sel['step']} (global step {sel['global_step']})"
