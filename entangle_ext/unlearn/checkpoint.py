"""Checkpoints and global state of a run: `seed_everything`, RNG capture/restore, the process-wide
settings a run changes (`preserved_global_state`), the checkpoint writer/reader, how run objects
(models, optimizers, multipliers, data streams, tensor lists) are saved into and restored from a
checkpoint, and the fingerprints that stop a resume from mixing two different runs.

A checkpoint is one ``torch.save`` dict: the run-wide entries (``method``, ``config``, ``fingerprint``,
``evals``, ``c0``, ``done`` (what the completed stages handed to the report: their history, the
final λ), ``timings``), the stage entries (``stage``, ``step``, ``history``, one entry per run
object), ``rng`` (python, numpy, torch and CUDA generator states), ``world_size`` (ranks of the
run that wrote it), ``tag`` and ``format`` (`CHECKPOINT_FORMAT`). Under several ranks rank 0 writes
it; run objects holding sharded (FSDP DTensor) state are written by every rank with
`torch.distributed.checkpoint` into ``{tag}.dcp/`` beside it, listed under ``sharded`` (§11)."""
from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import numpy as np
import torch

from .distributed import check_world_size, current
from .files import POINTER_NAME, atomic_write, make_out_dir, open_checkpoint, stage_label
from .fingerprint import FINGERPRINT_VERSION, splits_fingerprint
from .module_state import state_module, unwrapped_state
from .sharded import has_dtensor, init_optimizer_state, load_sharded, save_sharded, sharded_dir

__all__ = ["seed_everything", "rng_state", "set_rng_state", "preserved_rng", "preserved_global_state",
           "capture_state", "restore_state", "restore_objects", "Checkpointer", "load_checkpoint", "CHECKPOINT_FORMAT",
           "splits_fingerprint", "fingerprint_entry", "check_resume", "check_resume_config", "check_method", "load_resume", "RESUMABLE_CONFIG_FIELDS",
           "Reconfigured", "optimizer_entry"]

# 2: Stage-1 multipliers as an `AugmentedLagrangian` state dict; 3: fingerprint, done, timings;
# 4: world_size, sharded entries, Stage 2 keeps the reference losses instead of a model copy;
# 5: every checkpoint names its method (the two-stage family's did not), baselines' hold the fingerprint
CHECKPOINT_FORMAT = 5
#: Environment variables a run may set (restored by `preserved_global_state`).
ENV_KEYS = ("CUBLAS_WORKSPACE_CONFIG",)
#: Config fields that may differ between a checkpoint and the run resuming it: logging, checkpoints, plots, the
#: curve probes (eval_every; hence where a rule or ``select`` checks), Stage 2 added to a Stage-1-only two_stage
#: run, stage2.micro_batch and channels_last (the float round-off only). run_stage2, stage2.*: `UnlearnConfig`'s only.
RESUMABLE_CONFIG_FIELDS = ("log_every", "checkpoint_every", "histogram_bins", "eval_every", "run_stage2", "stage2.micro_batch", "channels_last")
#: Config fields added after checkpoints of this format were first written, with the value that
#: reproduces the earlier runs: a checkpoint whose config has the field's section (e.g. a
#: "stage2" entry; a top-level field: any entry) but not the field is read as holding this value
#: (`check_resume_config`; ``from_dict`` fills it from the dataclass default). Curves and rules: off.
ADDED_CONFIG_DEFAULTS = {"stage2.basis_every": 1, "eval_every": 0, "curve_samples": 256, "stage1.until": None,
                         "stage1.margin": None, "stage1.margin_fraction": 0.9, "stage1.violation_tol": 0.1,
                         "stage2.until": None, "stage2.recover_delta": 0.02, "stage2.drift_eps": 0.1, "select": None,
                         "select_forget_acc": None, "select_delta": 0.02, "amp": None, "recipe.amp": None, "recipe.channels_last": "auto"}


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally force deterministic algorithms
    (`torch.use_deterministic_algorithms`, cuDNN deterministic, the cuBLAS workspace variable)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def rng_state() -> Dict[str, Any]:
    """The python, numpy and torch (CPU, and every CUDA device when available) generator states."""
    s = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: Dict[str, Any]) -> None:
    """Restore the states captured by `rng_state` (CUDA ones only when CUDA is available)."""
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Context manager: the caller's generator states are restored on exit (also on error)."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


@contextlib.contextmanager
def preserved_global_state() -> Iterator[None]:
    """Context manager: every process-wide setting a run may change is restored on exit (also on
    error): the python/numpy/torch/CUDA generator states, `torch.use_deterministic_algorithms`
    (and its warn_only flag), ``torch.backends.cudnn.deterministic`` / ``.benchmark``, the torch
    thread count and the environment variables of ``ENV_KEYS`` (e.g. CUBLAS_WORKSPACE_CONFIG)."""
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), cudnn.deterministic,
             cudnn.benchmark, torch.get_num_threads(), {k: os.environ.get(k) for k in ENV_KEYS})
    with preserved_rng():
        try:
            yield
        finally:
            det, warn_only, cudnn.deterministic, cudnn.benchmark, threads, env = saved
            torch.use_deterministic_algorithms(det, warn_only=warn_only)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def capture_state(obj: Any) -> Any:
    """What a checkpoint stores for one run object: ``obj.state_dict()`` (modules, optimizers,
    `AugmentedLagrangian`, `BatchStream`; of a compiled model its module's, `state_module`), detached
    clones for a list of tensors (e.g. a momentum buffer), or the object itself for plain values."""
    if hasattr(obj, "state_dict"):
        return state_module(obj).state_dict()
    if isinstance(obj, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in obj):
        return [t.detach().clone() for t in obj]
    return obj


def restore_state(obj: Any, state: Any) -> None:
    """Inverse of `capture_state`, in place: ``obj.load_state_dict(state)`` (a model's keys with or
    without torch.compile's prefix, into either form: `unwrapped_state`) or a copy into each tensor
    of a list; plain values are read by the caller. ValueError: a tensor list of another length."""
    if hasattr(obj, "load_state_dict"):
        state_module(obj).load_state_dict(unwrapped_state(state) if isinstance(obj, torch.nn.Module) else state)
    elif isinstance(obj, (list, tuple)):
        if len(obj) != len(state):
            raise ValueError(f"checkpoint holds {len(state)} tensors where the run has {len(obj)}")
        with torch.no_grad():
            for t, s in zip(obj, state):
                t.copy_(s)


def restore_objects(objects: Dict[str, Any], state: Dict[str, Any]) -> None:
    """`restore_state` of every run object from the checkpoint ``state``; the entries it lists
    under ``sharded`` are first read from its `torch.distributed.checkpoint` directory (`sharded_dir`)
    into the objects' own state dicts (collective: every rank calls this)."""
    sharded = state.get("sharded") or {}
    names = [n for n in sharded.get("names", []) if n in objects]
    loaded: Dict[str, Any] = {}
    if names:
        path = sharded_dir(state)
        for n in names:
            getattr(objects[n], "prepare_load", lambda: None)()
        loaded = load_sharded({n: capture_state(objects[n]) for n in names}, path)
    for name, obj in objects.items():
        restore_state(obj, loaded[name] if name in loaded else state[name])


class Reconfigured:
    """A run object whose settings come from the run's config, not from a checkpoint: it is saved
    as ``obj.state_dict()``; loading restores that state, then calls ``reapply()`` (so a resume
    with a deliberately changed config uses the new learning rate, μ, ...). ``prepare_load()``
    (optional) readies ``obj`` to be the template of a sharded load."""

    def __init__(self, obj: Any, reapply: Callable[[], None],
                 prepare_load: Optional[Callable[[], None]] = None):
        self.obj, self.reapply = obj, reapply
        if prepare_load is not None:
            self.prepare_load = prepare_load

    def state_dict(self) -> Dict[str, Any]:
        return self.obj.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.obj.load_state_dict(state)
        self.reapply()


def optimizer_entry(opt: torch.optim.Optimizer) -> Reconfigured:
    """`Reconfigured` for an optimizer: its param-group hyperparameters (lr, betas, eps, ...) as
    constructed now survive loading a checkpoint's optimizer state."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]

    def reapply():
        for g, h in zip(opt.param_groups, groups):
            g.update(h)
    return Reconfigured(opt, reapply, lambda: init_optimizer_state(opt))


class Checkpointer:
    """Writes ``{out_dir}/checkpoints/{tag}.pt`` atomically (tmp + rename), with the run-wide
    entries of ``common`` (a dict the run may extend during the run), those ``dynamic()``
    returns at that moment (e.g. the timings so far) and the RNG states, and points
    ``checkpoints/latest.pt`` at it. ``last_path`` is the last good checkpoint (None before the
    first one, or always when ``out_dir`` is None: then nothing is written).

    The stages call it as ``checkpointer(step, state)`` (tag ``stage{S}_step{step:06d}``, a
    baseline's ``{name}_step{step:06d}``); ``resume_hint`` is the call that continues the run
    (quoted when a run is interrupted).
    """

    def __init__(self, out_dir: Optional[Union[str, Path]], common: Dict[str, Any],
                 dynamic: Optional[Callable[[], Dict[str, Any]]] = None):
        self.dir = Path(out_dir) / "checkpoints" if out_dir is not None else None
        self.common, self.dynamic = common, dynamic
        self.last_path: Optional[str] = None
        if self.dir is not None:
            make_out_dir(self.dir, "out_dir's checkpoints folder")   # ValueError: e.g. a file named checkpoints

    @property
    def resume_hint(self) -> Optional[str]:
        if self.dir is None:
            return None
        out, method = str(self.dir.parent), self.common.get("method", "two_stage")
        named = "" if method == "two_stage" else f", method={method!r}"
        return f"entangle_ext.unlearn(model, splits{named}, resume={out!r}, out_dir={out!r})"

    def no_checkpoint_note(self, checkpoint_every: int) -> str:
        """Why ``last_path`` is None when a stage stops, and what keeps a checkpoint next time."""
        if self.dir is None:
            return "no checkpoint was written: pass out_dir (--out) to keep checkpoints"
        if checkpoint_every > 0:
            return (f"no checkpoint was written yet: the first was due after step {checkpoint_every} "
                    "(checkpoint_every)")
        return ("no checkpoint was written: no stage had finished and checkpoint_every is 0; set "
                "checkpoint_every (--checkpoint-every) to keep mid-stage checkpoints")

    def save(self, tag: str, state: Dict[str, Any]) -> Optional[str]:
        """Write ``common`` + ``dynamic()`` + ``state`` under ``tag``; returns the path (None
        without out_dir). Under several ranks: rank 0 writes the file, sharded entries of
        ``state`` go to ``{tag}.dcp/`` (every rank; collective)."""
        if self.dir is None:
            return None
        d = current()
        path = self.dir / f"{tag}.pt"
        names = [k for k, v in state.items() if has_dtensor(v)]
        if names:
            save_sharded({k: state[k] for k in names}, str(self.dir / f"{tag}.dcp"))
            state = {k: v for k, v in state.items() if k not in names}
            state["sharded"] = {"names": names, "path": str(self.dir / f"{tag}.dcp")}
        if d.is_main:
            dyn = self.dynamic() if self.dynamic is not None else {}
            kept = (f"the last complete checkpoint {self.last_path} is kept ({POINTER_NAME} names it): free "
                    f"space, then resume from {self.dir.parent} (resume= / --resume)" if self.last_path else
                    "no checkpoint of this run is complete yet")
            _atomic_save({**self.common, **dyn, **state, "rng": rng_state(), "tag": tag,
                          "world_size": d.world, "format": CHECKPOINT_FORMAT}, path, kept)
            _atomic_save({"path": str(path)}, self.dir / POINTER_NAME, kept)
        self.last_path = str(path)
        return self.last_path

    def __call__(self, step: int, state: Dict[str, Any]) -> Optional[str]:
        return self.save(f"{stage_label(state['stage'])}_step{step:06d}", state)   # (salun_step000005, not stagesalun_)


def _atomic_save(obj: Any, path: Path, hint: Optional[str] = None) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp), what="checkpoint", hint=hint)


def load_checkpoint(path: Union[str, Path]) -> Dict[str, Any]:
    """Load a checkpoint written by `unlearn` (or a baseline through it) onto the CPU, safely
    (`read_torch_file` of ``entangle_ext/unlearn/files.py``: ``weights_only=True``).

    Args:
        path: a checkpoint file, a ``checkpoints/latest.pt`` pointer (followed), or an out dir /
            checkpoints dir (its latest checkpoint).
    Raises:
        FileNotFoundError: no such file, or no checkpoint under the directory.
        ValueError: not a readable torch file (one line, the short reason), not a checkpoint (e.g.
            a model state dict), or a checkpoint of another format (another version of the package).
    """
    p, ckpt = open_checkpoint(path)
    check_format(ckpt, str(p))
    ckpt.setdefault("path", str(p))
    return ckpt


def check_format(ckpt: Dict[str, Any], where: str = "the checkpoint") -> None:
    """ValueError when ``ckpt`` was written in another `CHECKPOINT_FORMAT`."""
    if isinstance(ckpt, dict) and "format" not in ckpt and "config" not in ckpt:
        raise ValueError(f"{where} is not an entangle_ext checkpoint (no 'format' or 'config' entry); a "
                         "model file is given as the original model (--original / original=), not resumed")
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        fmt = ckpt.get("format", 1) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{where} has format {fmt}, this version of entangle_ext reads format "
                         f"{CHECKPOINT_FORMAT}: restart the run")


# ------------------------------------------------------------------------------ fingerprints
# (`splits_fingerprint` lives in fingerprint.py, the one home of the package's fingerprints)
def fingerprint_entry(splits_fp: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The ``fingerprint`` entry of a checkpoint (and of a report): {"version", "splits"}."""
    return {"version": FINGERPRINT_VERSION, "splits": splits_fp}


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def check_resume(ckpt: Dict[str, Any], fingerprint: Dict[str, Any], config: Dict[str, Any], *,
                 allow_config_change: bool = False) -> Dict[str, List[Any]]:
    """Compare a checkpoint with the run resuming it (any method: the one run lifecycle,
    `entangle_ext.methods.run_method`, calls this).

    Args:
        ckpt: the checkpoint. fingerprint: `splits_fingerprint` of the resuming run's splits.
        config: the resuming run's config as ``to_dict()`` (`UnlearnConfig` or a baseline's Config).
        allow_config_change: accept config differences (other than `RESUMABLE_CONFIG_FIELDS`,
            which are always accepted) instead of raising.
    Returns:
        {"stage2.lr": [checkpoint value, new value], ...}: the accepted config differences.
    Raises:
        ValueError: the splits differ (names, sizes or content hash: always), or the config
            differs and ``allow_config_change`` is False; the message names every difference and
            what to do (in Python and on the command line).
    """
    entry = ckpt.get("fingerprint", {})
    if entry.get("version") != FINGERPRINT_VERSION:
        raise ValueError(f"resume: the checkpoint's splits fingerprint is of an earlier version of entangle_ext "
                         f"(version {entry.get('version', 1)}; this one writes {FINGERPRINT_VERSION}, which hashes "
                         "every item of every split), so it cannot show that the data are unchanged: restart the "
                         "run without resume (command line: without --resume, in a fresh --out)")
    old_fp = entry.get("splits", {})
    bad = []
    for name in sorted(set(old_fp) | set(fingerprint)):
        a, b = old_fp.get(name), fingerprint.get(name)
        if a != b:
            what = ("absent" if a is None else f"{a['n']} samples") + " in the checkpoint vs " + \
                   ("absent" if b is None else f"{b['n']} samples") + " now"
            if a is not None and b is not None and a["n"] == b["n"]:
                what = f"same size ({a['n']}) but different content (labels / samples / order)"
            bad.append(f"split {name!r}: {what}")
    if bad:
        raise ValueError("resume: the splits differ from those of the checkpoint (the table would "
                         "mix rows evaluated on different data): " + "; ".join(bad))
    return check_resume_config(ckpt, config, allow_config_change=allow_config_change)


def check_resume_config(ckpt: Dict[str, Any], config: Dict[str, Any], *,
                        allow_config_change: bool = False) -> Dict[str, List[Any]]:
    """The config half of `check_resume` (it needs no data: the command line runs it before
    loading any). Returns the accepted differences; raises ValueError as `check_resume`."""
    old, new = (_flatten(json.loads(json.dumps(c))) for c in (ckpt.get("config", {}), config))
    for k, default in ADDED_CONFIG_DEFAULTS.items():   # on both sides: either may predate the field
        section = k.rsplit(".", 1)[0] + "." if "." in k else ""
        for side in (old, new):
            if k not in side and any(o.startswith(section) for o in side):
                side[k] = default
    diff = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k) and k not in RESUMABLE_CONFIG_FIELDS}
    if diff and not allow_config_change:
        lines = "; ".join(f"{k}: {a!r} in the checkpoint vs {b!r} now" for k, (a, b) in diff.items())
        raise ValueError(f"resume: the config differs from the checkpoint's: {lines}. To continue the "
                         "checkpoint's run, resume with config=None (command line: the flags of the run that wrote "
                         "it, plus --set KEY=VALUE for a preset default changed since, e.g. amp=none); to change it "
                         "deliberately (recorded), pass allow_config_change=True (command line: --allow-config-change)")
    return diff


def check_method(ckpt: Dict[str, Any], method: str, where: str = "resume: the checkpoint") -> None:
    """ValueError when ``ckpt`` was written by another method than ``method`` (e.g. a two_stage
    checkpoint resumed as no_w2, or a baseline's as two_stage): the run would continue the
    checkpoint's method and config under another name. The message names both methods."""
    written = ckpt.get("method")
    if written is None:
        raise ValueError(f"{where} names no method (not written by entangle_ext.unlearn): cannot resume it")
    if written != method:
        raise ValueError(f"{where} was written by method {written!r}, not {method!r}: resume it with "
                         f"method={written!r} (command line: --method {written}), or start a new run")


def load_resume(resume: Union[None, str, Path, Dict[str, Any]], method: str) -> Optional[Dict[str, Any]]:
    """The checkpoint a run of ``method`` resumes from (None when ``resume`` is None): a path or
    out dir read by `load_checkpoint`, or an already loaded dict (its format checked), written by
    ``method`` on this run's number of ranks.

    Raises:
        FileNotFoundError, ValueError: as `load_checkpoint`; ValueError: written by another method
            (`check_method`) or on another number of ranks.
    """
    if resume is None:
        return None
    if isinstance(resume, dict):
        check_format(resume)
        ckpt = resume
    else:
        ckpt = load_checkpoint(resume)
    check_method(ckpt, method)
    check_world_size(ckpt)
    return ckpt
