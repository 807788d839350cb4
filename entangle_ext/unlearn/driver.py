"""`entangle_ext.unlearn`: original evaluation → Stage 1 → Stage 2 → report (method.md)."""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch

from .config import UnlearnConfig
from .data import BatchStream, Splits, forward_logits, split_batch
from .evaluate import evaluate, format_table, plot_forget_histograms
from .stages import stage1, stage2

__all__ = ["unlearn", "UnlearnResult", "seed_everything", "Checkpointer", "load_checkpoint"]


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


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally force deterministic algorithms."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def _rng_state() -> dict:
    s = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


class Checkpointer:
    """Writes ``{out_dir}/checkpoints/{tag}.pt`` atomically (tmp + rename) and remembers the last
    good one in ``last_path``. Called as ``ckpt(step, state)`` by the stages."""

    def __init__(self, out_dir: Optional[Union[str, Path]], common: Dict[str, Any]):
        self.dir = Path(out_dir) / "checkpoints" if out_dir is not None else None
        self.common = common
        self.last_path: Optional[str] = None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def save(self, tag: str, state: Dict[str, Any]) -> Optional[str]:
        if self.dir is None:
            return None
        path = self.dir / f"{tag}.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save({**self.common, **state, "rng": _rng_state(), "tag": tag}, tmp)
        os.replace(tmp, path)
        latest = self.dir / "latest.pt"
        tmp2 = self.dir / "latest.pt.tmp"
        torch.save({"path": str(path)}, tmp2)
        os.replace(tmp2, latest)
        self.last_path = str(path)
        return self.last_path

    def __call__(self, step: int, state: Dict[str, Any]) -> Optional[str]:
        return self.save(f"stage{state['stage']}_step{step:06d}", state)


def load_checkpoint(path: Union[str, Path]) -> Dict[str, Any]:
    """Load a checkpoint written by `unlearn` (a file, or an out dir / checkpoints dir, whose
    latest checkpoint is used). Raises FileNotFoundError."""
    p = Path(path)
    if p.is_dir():
        cand = [p / "checkpoints" / "latest.pt", p / "latest.pt"]
        for c in cand:
            if c.exists():
                p = Path(torch.load(c, weights_only=False)["path"])
                break
        else:
            raise FileNotFoundError(f"no checkpoint under {path}")
    if not p.exists():
        raise FileNotFoundError(f"checkpoint {p} not found")
    return torch.load(p, map_location="cpu", weights_only=False)


@torch.no_grad()
def _preflight(model, splits: Splits, device) -> int:
    """Probe one batch per split: integer 1-D labels, 2-D logits, consistent class count. Returns C."""
    splits.check()
    C = None
    for name, ds in splits.named().items():
        b = BatchStream(ds, 2, shuffle=False, seed=0, name="probe", device=device).fetch(torch.arange(min(2, len(ds))))
        inputs, y = split_batch(b)
        if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.dtype.is_floating_point \
                or y.dtype == torch.bool or y.dtype.is_complex:
            got = f"{y.dtype} of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(f"split '{name}': labels must be integer class indices of shape (batch,) "
                             f"(e.g. int64), got {got}; one-hot or soft labels are not supported")
        logits = forward_logits(model, inputs)
        C = logits.shape[1] if C is None else C
    return C


def unlearn(model: torch.nn.Module, splits: Splits, config: Optional[UnlearnConfig] = None, *,
            device: Optional[Union[str, torch.device]] = None,
            out_dir: Optional[Union[str, Path]] = None,
            resume: Optional[Union[str, Path, Dict[str, Any]]] = None,
            progress: bool = True) -> UnlearnResult:
    """Run the two-stage method of method.md on ``model`` and report the three splits.

    Steps: evaluate θ0 on all splits (c0 = its remote-train mean CE) → `stage1` (augmented
    Lagrangian) → evaluate → `stage2` (W-PGD) → evaluate → table, JSON report, histogram PNG.

    Args:
        model: classifier returning (B, C) logits (tensor, tuple or object with ``.logits``); moved
            to ``device``, kept in eval mode, updated in place. Float32 or float64.
        splits: `Splits` (forget/adjacent/remote train + optional held-out).
        config: `UnlearnConfig` (default: ``UnlearnConfig()``, i.e. the CIFAR-100 hyperparameters).
        device: "cpu"/"cuda"/torch.device (default: the model's device).
        out_dir: writes ``report.json``, ``forget_loss_hist.png``, ``history.json`` and
            ``checkpoints/`` (after each stage and every ``config.checkpoint_every`` steps).
        resume: checkpoint path / out dir / loaded dict; continues from that point (the config
            stored in the checkpoint is used when ``config`` is None).
        progress: tqdm bars.
    Randomness: python, numpy and torch are seeded from ``config.seed`` for the run (reproducible
    data order), and the caller's random-generator states are restored on return.
    Returns:
        `UnlearnResult` (model, report, history, table).
    Raises:
        ValueError: empty splits, labels outside the model's classes, non 2-D logits, bad config.
        NonFiniteLossError (a ValueError): NaN/Inf loss; names the stage and step; the last good
            checkpoint is kept.
    """
    saved_rng = _rng_state()   # the run is seeded from config.seed; the caller's RNG is left as it was
    try:
        return _unlearn(model, splits, config, device=device, out_dir=out_dir, resume=resume,
                        progress=progress)
    finally:
        _set_rng_state(saved_rng)


def _unlearn(model, splits, config, *, device, out_dir, resume, progress) -> UnlearnResult:
    ckpt = None
    if resume is not None:
        ckpt = resume if isinstance(resume, dict) else load_checkpoint(resume)
        if config is None:
            config = UnlearnConfig.from_dict(ckpt["config"])
    config = config or UnlearnConfig()
    if not isinstance(splits, Splits):
        raise TypeError("splits must be an entangle_ext.Splits")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).eval()
    seed_everything(config.seed, config.deterministic)
    if ckpt is not None and "rng" in ckpt:
        _set_rng_state(ckpt["rng"])
    C = _preflight(model, splits, device)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    timings: Dict[str, float] = {}
    evals: Dict[str, Dict[str, dict]] = dict(ckpt.get("evals", {})) if ckpt else {}
    history: List[dict] = []
    common = {"config": config.to_dict(), "evals": evals}
    saver = Checkpointer(out, common)

    done_stage = 0
    if ckpt is not None:
        done_stage = ckpt["stage"] if ckpt.get("stage_done") else ckpt["stage"] - 1
    def ev(tag):
        t = time.perf_counter()
        evals[tag] = evaluate(model, splits, device=device, batch_size=config.eval_batch_size,
                              num_classes=C)
        timings[f"eval_{tag}"] = time.perf_counter() - t

    if "original" not in evals:
        ev("original")
    c0 = evals["original"]["remote"]["loss"] if "c0" not in (ckpt or {}) else ckpt["c0"]
    if not math.isfinite(c0):
        raise ValueError(f"the original model's mean cross-entropy on the remote train set (c0, the "
                         f"Stage-1 constraint target) is {c0}: the model produces non-finite logits "
                         "before unlearning starts")
    lam = None

    # ---- Stage 1
    s1_state = ckpt if (ckpt is not None and ckpt["stage"] == 1 and not ckpt.get("stage_done")) else None
    if config.run_stage1 and done_stage < 1:
        t = time.perf_counter()
        r1 = stage1(model, splits, config.stage1, device=device, seed=config.seed, c0=c0,
                    eval_batch_size=config.eval_batch_size, log_every=config.log_every,
                    checkpoint_every=config.checkpoint_every, checkpoint_fn=saver,
                    resume_state=s1_state, progress=progress)
        timings["stage1"] = time.perf_counter() - t
        history += r1.history
        lam = float(r1.lam)
        ev("stage1")
        saver.save("stage1_done", {"stage": 1, "stage_done": True, "step": r1.steps,
                                   "model": model.state_dict(), "lam": r1.lam.detach().clone(),
                                   "c0": c0, "history": history})
    elif ckpt is not None and done_stage >= 1:
        model.load_state_dict(ckpt["model"]) if ckpt["stage"] == 1 else None
        history += [h for h in ckpt.get("history", []) if h.get("stage") == 1]
        lam = float(ckpt["lam"]) if "lam" in ckpt else None

    # ---- Stage 2
    s2_state = ckpt if (ckpt is not None and ckpt["stage"] == 2 and not ckpt.get("stage_done")) else None
    if config.run_stage2 and done_stage < 2:
        t = time.perf_counter()
        s1_hist = list(history)
        r2 = stage2(model, splits, config.stage2, device=device, seed=config.seed,
                    log_every=config.log_every, checkpoint_every=config.checkpoint_every,
                    checkpoint_fn=saver, resume_state=s2_state, progress=progress)
        timings["stage2"] = time.perf_counter() - t
        history = s1_hist + r2.history
        ev("stage2")
        saver.save("stage2_done", {"stage": 2, "stage_done": True, "step": r2.steps,
                                   "model": model.state_dict(), "history": history})
    elif ckpt is not None and done_stage >= 2:
        model.load_state_dict(ckpt["model"])
        history = list(ckpt.get("history", []))

    table = format_table(evals)
    report = {"config": config.to_dict(), "num_classes": C, "c0": c0, "lambda_final": lam,
              "steps": {"stage1": sum(1 for h in history if h["stage"] == 1),
                        "stage2": sum(1 for h in history if h["stage"] == 2)},
              "timings_s": timings,
              "evals": {t: {n: {k: v for k, v in r.items() if k != "losses"} for n, r in e.items()}
                        for t, e in evals.items()},
              "checkpoint": saver.last_path}
    if out is not None:
        report["histogram_png"] = plot_forget_histograms(evals, str(out / "forget_loss_hist.png"),
                                                         bins=config.histogram_bins, num_classes=C)
        with open(out / "report.json", "w") as f:
            json.dump(report, f, indent=2)
        with open(out / "history.json", "w") as f:
            json.dump(history, f)
    if progress:
        print(table)
    return UnlearnResult(model=model, report=report, history=history, table=table)
