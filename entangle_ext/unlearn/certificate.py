"""The two-stage family's certificate: whether the assumptions of the paper's Prop. 4.2 held on
the run's own train evaluations (docs/algorithm.md "Curves, certificate and stopping rules
(ours)"). Prop. 4.2 assumes that after Stage 1 every forget sample has loss >= m and that Stage 2
ends with |L̃_f(θ) − L̃_f(θ̄)| < ε; the run measures both on the whole forget *train* set (the
per-sample losses of its evaluations "stage1" / "stage2"), with no extra forward pass."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch

from ..wasserstein import wasserstein2_1d

__all__ = ["certificate", "certificate_line", "NOT_APPLICABLE"]

NOT_APPLICABLE: Dict[str, Any] = {"applies": False}
"""The certificate entry of a method outside the two-stage family (a baseline)."""


def _w2(a, b) -> float:
    """W2 distance (nats) of two per-sample loss lists (`entangle_ext.wasserstein2_1d`, squared)."""
    w2sq = float(wasserstein2_1d(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                                 validate=False))
    return math.sqrt(max(w2sq, 0.0)) if math.isfinite(w2sq) else float("nan")


def certificate(evals: Dict[str, Dict[str, dict]], *, margin: float, eps: float) -> Dict[str, Any]:
    """The certificate of a two-stage run from its evaluations.

    Args:
        evals: {tag: {split: {"acc", "loss" (mean CE, nats), "losses" (forget: per-sample CE)}}}
            as the run keeps them; θ̄ (the Stage-2 entry model) is "stage1" when Stage 1 ran,
            else "original" (e.g. pgd_mean).
        margin: m in nats (default of the run: log C + 1). eps: ε in nats.
    Returns:
        {"applies": True, "margin", "eps", "entry" (θ̄'s tag), "stage1": {"margin_share" (fraction
        of forget train samples with CE >= m at θ̄), "n"}, "stage2": {"mean_forget_loss_change"
        (|mean CE(θ) − mean CE(θ̄)| on the forget train set, nats), "w2" (W2 distance of the two
        per-sample profiles, nats)} or None (no Stage 2), "held" (bool), "reason" (str)}.
    Raises: KeyError when ``evals`` has no forget entry of "original".
    """
    entry = "stage1" if "stage1" in evals else "original"
    ent = evals[entry]["forget"]
    losses = ent.get("losses")
    cert: Dict[str, Any] = {"applies": True, "margin": float(margin), "eps": float(eps), "entry": entry}
    reasons = []
    if losses:
        above = sum(1 for v in losses if v >= margin)
        cert["stage1"] = {"margin_share": above / len(losses), "n": len(losses)}
        if above < len(losses):
            reasons.append(f"at θ̄ ({entry}) only {above} of {len(losses)} forget train samples have loss >= "
                           f"m = {margin:.3f} nats")
    else:
        cert["stage1"] = None
        reasons.append(f"no per-sample forget losses of {entry!r} to check the margin")
    if "stage2" in evals:
        now = evals["stage2"]["forget"]
        change = abs(float(now["loss"]) - float(ent["loss"]))
        w2 = _w2(now["losses"], losses) if losses and now.get("losses") else None
        cert["stage2"] = {"mean_forget_loss_change": change, "w2": w2}
        if not change < eps:
            reasons.append(f"after Stage 2 |L̃_f(θ) − L̃_f(θ̄)| = {change:.3f} nats is not < ε = {eps:g}")
    else:
        cert["stage2"] = None
        reasons.append("Stage 2 did not run (Prop. 4.2 is a statement about its output)")
    cert["held"] = not reasons
    cert["reason"] = "; ".join(reasons) if reasons else \
        "every forget train sample has loss >= m after Stage 1 and the mean forget loss moved by < ε in Stage 2"
    return cert


def certificate_line(cert: Optional[Dict[str, Any]]) -> str:
    """The one footer line (at most 100 characters, as the table) of the printed table: held or
    not, the margin share at θ̄, |ΔL_f| against ε and the W2 drift ("" for a method it does not
    apply to; ``cert["reason"]`` in the report says why in full)."""
    if not cert or not cert.get("applies"):
        return ""
    parts = ["held" if cert["held"] else "NOT held"]
    if cert.get("stage1"):
        parts.append(f"loss ≥ m={cert['margin']:.2f}: {100 * cert['stage1']['margin_share']:.1f}% of forget")
    s2 = cert.get("stage2")
    if s2:
        change = s2["mean_forget_loss_change"]
        parts.append(f"|ΔL_f|={change:.3f} {'<' if change < cert['eps'] else '≥'} ε={cert['eps']:g}")
        parts.append("W2 -" if s2["w2"] is None else f"W2 {s2['w2']:.3f}")
    else:
        parts.append("no Stage 2")
    return "certificate (Prop. 4.2): " + " · ".join(parts)

