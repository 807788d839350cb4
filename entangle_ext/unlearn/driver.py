"""`entangle_ext.unlearn`: evaluate the original model → Stage 1 → evaluate → Stage 2 → evaluate
→ report (docs/algorithm.md §2, §3)."""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

from .checkpoint import Checkpointer, load_checkpoint, preserved_rng, seed_everything, set_rng_state
from .config import UnlearnConfig
from .data import BatchStream, Splits, forward_logits, split_batch
from .evaluate import evaluate
from .report import build_report, format_table, write_report
from .stages import stage1, stage2

__all__ = ["unlearn", "UnlearnResult"]


@dataclass
class UnlearnResult:
    """Result of `unlearn`.

    Attributes:
        model: the unlearned model (same object as the input, updated in place, eval mode).
        report: JSON-serialisable dict: config, c0, λ, step counts, timings, evaluations
            ({"original"|"stage1"|"stage2": {split: {"acc", "loss", "n", ...}}}), paths.
        history: per-step records (dicts with "stage", "step", "loss", ... floats).
        table: the printed accuracy table.
    """
    model: torch.nn.Module
    report: Dict[str, Any]
    history: List[Dict[str, float]] = field(default_factory=list)
    table: str = ""


def unlearn(model: torch.nn.Module, splits: Splits, config: Optional[UnlearnConfig] = None, *,
            method: str = "two_stage", setting: Optional[str] = None, hparams: str = "paper_code",
            model_fn=None, seed: Optional[int] = None, device: Optional[Union[str, torch.device]] = None,
            out_dir: Optional[Union[str, Path]] = None,
            resume: Optional[Union[str, Path, Dict[str, Any]]] = None,
            progress: bool = True) -> UnlearnResult:
    """Run the two-stage method (docs/algorithm.md §2, §3) on ``model`` and report the three splits.

    Steps: evaluate θ0 on all splits (c0 = its remote-train mean CE) → `stage1` (augmented
    Lagrangian) → evaluate → `stage2` (W-PGD) → evaluate → table, JSON report, histogram PNG.

    Args:
        model: classifier returning (B, C) logits (tensor, tuple or object with ``.logits``); moved
            to ``device``, kept in eval mode, updated in place. Float32 or float64.
        splits: `Splits` (forget/adjacent/remote train + optional held-out).
        config: `UnlearnConfig` (default: ``UnlearnConfig()``, i.e. the CIFAR-100 hyperparameters);
            validated here, so fields assigned after construction are checked too. For a baseline
            ``method``: that method's Config (None: its preset, docs/algorithm.md §10).
        method: a name of `entangle_ext.methods.available_methods()`: "two_stage" (this method),
            its ablations "no_w2", "pgd_mean", "stage1_only" (rewrite the UnlearnConfig), or a
            baseline (run by `entangle_ext.methods.run_method`; same report structure).
        setting, hparams: when ``config`` is None, the preset of that setting ("digits",
            "cifar100", ...) in the family "paper_code" (the released code; recipe "reference")
            or "original" (the baseline authors' defaults; the paper's recipe for the two-stage
            family). model_fn: "retrain" only: builds a fresh model.
        seed: the run's seed, replacing ``config.seed`` (of an explicit, preset or resumed
            config; None keeps it): data order, random labels, re-initialisation, every stream.
        device: "cpu"/"cuda"/torch.device (default: the model's device).
        out_dir: writes ``report.json``, ``forget_loss_hist.png``, ``history.json`` and
            ``checkpoints/`` (after each stage and every ``config.checkpoint_every`` steps).
        resume: checkpoint path / out dir / loaded dict; continues from that point (the config
            stored in the checkpoint is used when ``config`` is None).
        progress: tqdm bars.
    Randomness: python, numpy and torch are seeded from ``config.seed`` (or ``seed``) for the run
    (reproducible data order), and the caller's random-generator states are restored on return.
    Returns:
        `UnlearnResult` (model, report, history, table); ``report["method"]``,
        ``report["evals"]["final"]`` (the last evaluation) and ``report["timings_s"]["unlearn"]``
        (seconds of unlearning, evaluation excluded) exist for every method.
    Raises:
        ValueError: empty splits, labels outside the model's classes, non 2-D logits, an invalid
            config (TypeError for a wrong field type or a non-`Splits` ``splits``).
        NonFiniteLossError (a ValueError): NaN/Inf loss; names the stage and step; the last good
            checkpoint is kept.
    """
    from ..methods import get_method, run_method   # lazy: the methods package builds on this module
    spec = get_method(method)
    if not spec.two_stage:
        return run_method(spec, model, splits, config, setting=setting, hparams=hparams, model_fn=model_fn,
                          seed=seed, device=device, out_dir=out_dir, resume=resume, progress=progress)
    if config is not None or resume is None:
        config = spec.two_stage_config(config, setting, hparams)
    with preserved_rng():   # the run is seeded from config.seed; the caller's RNG is left as it was
        ckpt = None if resume is None else resume if isinstance(resume, dict) else load_checkpoint(resume)
        if config is None:
            config = UnlearnConfig.from_dict(ckpt["config"]) if ckpt is not None else UnlearnConfig()
        if not isinstance(config, UnlearnConfig):
            raise TypeError(f"config must be an entangle_ext.UnlearnConfig, got {type(config).__name__}")
        if seed is not None:
            config = dataclasses.replace(config, seed=seed)
        config.validate()
        if not isinstance(splits, Splits):
            raise TypeError("splits must be an entangle_ext.Splits")
        device = torch.device(device) if device is not None else next(model.parameters()).device
        model.to(device).eval()
        seed_everything(config.seed, config.deterministic)
        if ckpt is not None and "rng" in ckpt:
            set_rng_state(ckpt["rng"])
        run = _Run(model, splits, config, device, _preflight(model, splits, device), out_dir, ckpt,
                   progress)
        run.method = method
        if "original" not in run.evals:
            run.evaluate("original")
        c0 = run.constraint_target()
        lam = run.stage1(c0)
        run.stage2()
        return run.finish(c0, lam)


@torch.no_grad()
def _preflight(model, splits: Splits, device) -> int:
    """Probe one batch per split: integer 1-D labels, 2-D logits, consistent class count. Returns C."""
    splits.check()
    C = None
    for name, ds in splits.named().items():
        probe = BatchStream(ds, 2, shuffle=False, seed=0, name="probe", device=device)
        b = probe.fetch(torch.arange(min(2, len(ds))))
        inputs, y = split_batch(b)
        if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.dtype.is_floating_point \
                or y.dtype == torch.bool or y.dtype.is_complex:
            got = f"{y.dtype} of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(f"split '{name}': labels must be integer class indices of shape (batch,) "
                             f"(e.g. int64), got {got}; one-hot or soft labels are not supported")
        logits = forward_logits(model, inputs)
        C = logits.shape[1] if C is None else C
    return C


class _Run:
    """One `unlearn` call: its evaluations, timings, step history, checkpoints and resume point."""
    method = "two_stage"

    def __init__(self, model, splits, config: UnlearnConfig, device, num_classes: int, out_dir,
                 ckpt: Optional[Dict[str, Any]], progress: bool):
        self.model, self.splits, self.config, self.device = model, splits, config, device
        self.num_classes, self.progress = num_classes, progress
        self.out = Path(out_dir) if out_dir is not None else None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt = ckpt or {}
        self.evals: Dict[str, Dict[str, dict]] = dict(self.ckpt.get("evals", {}))
        self.timings: Dict[str, float] = {}
        self.history: List[dict] = []
        self.saver = Checkpointer(self.out, {"config": config.to_dict(), "evals": self.evals})
        # stages completed by the checkpoint we resume from
        self.done_stage = 0 if not self.ckpt else \
            self.ckpt["stage"] if self.ckpt.get("stage_done") else self.ckpt["stage"] - 1

    def _timed(self, name: str, fn):
        t = time.perf_counter()
        out = fn()
        self.timings[name] = time.perf_counter() - t
        return out

    def evaluate(self, tag: str) -> None:
        self.evals[tag] = self._timed(f"eval_{tag}", lambda: evaluate(
            self.model, self.splits, device=self.device, batch_size=self.config.eval_batch_size,
            num_classes=self.num_classes))

    def constraint_target(self) -> float:
        """c0 = the original model's mean CE on the remote train set (nats); ValueError if not finite."""
        c0 = self.ckpt["c0"] if "c0" in self.ckpt else self.evals["original"]["remote"]["loss"]
        if not math.isfinite(c0):
            raise ValueError(f"the original model's mean cross-entropy on the remote train set (c0, the "
                             f"Stage-1 constraint target) is {c0}: the model produces non-finite logits "
                             "before unlearning starts")
        self.saver.common["c0"] = c0
        return c0

    def _loop_args(self, stage: int) -> Dict[str, Any]:
        resume = self.ckpt if self.ckpt.get("stage") == stage and not self.ckpt.get("stage_done") else None
        return dict(device=self.device, seed=self.config.seed, log_every=self.config.log_every,
                    checkpoint_every=self.config.checkpoint_every, checkpoint_fn=self.saver,
                    resume_state=resume, progress=self.progress)

    def stage1(self, c0: float) -> Optional[float]:
        """Run (or take from the checkpoint) Stage 1; returns the final λ (None when skipped)."""
        if self.config.run_stage1 and self.done_stage < 1:
            r = self._timed("stage1", lambda: stage1(
                self.model, self.splits, self.config.stage1, c0=c0,
                eval_batch_size=self.config.eval_batch_size, **self._loop_args(1)))
            self.history += r.history
            self.evaluate("stage1")
            self.saver.save("stage1_done", {"stage": 1, "stage_done": True, "step": r.steps,
                                            "model": self.model.state_dict(),
                                            "lagrangian": r.lagrangian.state_dict(),
                                            "history": self.history})
            return float(r.lam)
        if self.ckpt and self.done_stage >= 1:
            if self.ckpt["stage"] == 1:
                self.model.load_state_dict(self.ckpt["model"])
            self.history += [h for h in self.ckpt.get("history", []) if h.get("stage") == 1]
            return float(self.ckpt["lagrangian"]["lam"]) if "lagrangian" in self.ckpt else None
        return None

    def stage2(self) -> None:
        """Run (or take from the checkpoint) Stage 2."""
        if self.config.run_stage2 and self.done_stage < 2:
            r = self._timed("stage2", lambda: stage2(self.model, self.splits, self.config.stage2,
                                                     **self._loop_args(2)))
            self.history = self.history + r.history
            self.evaluate("stage2")
            self.saver.save("stage2_done", {"stage": 2, "stage_done": True, "step": r.steps,
                                            "model": self.model.state_dict(),
                                            "history": self.history})
        elif self.ckpt and self.done_stage >= 2:
            self.model.load_state_dict(self.ckpt["model"])
            self.history = list(self.ckpt.get("history", []))

    def finish(self, c0: float, lam: Optional[float]) -> UnlearnResult:
        """Table, report (and its files under out_dir); prints the table when progress is on."""
        table = format_table(self.evals)
        report = build_report(config=self.config.to_dict(), num_classes=self.num_classes, c0=c0,
                              lam=lam, history=self.history, timings=self.timings,
                              evals=self.evals, checkpoint=self.saver.last_path)
        last = next(t for t in ("stage2", "stage1", "original") if t in report["evals"])
        report["method"], report["evals"]["final"] = self.method, copy.deepcopy(report["evals"][last])
        report["timings_s"]["unlearn"] = self.timings.get("stage1", 0.0) + self.timings.get("stage2", 0.0)
        if self.out is not None:
            write_report(self.out, report, self.history, self.evals,
                         bins=self.config.histogram_bins, num_classes=self.num_classes)
        if self.progress:
            print(table)
        return UnlearnResult(model=self.model, report=report, history=self.history, table=table)
