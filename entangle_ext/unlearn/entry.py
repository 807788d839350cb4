"""`entangle_ext.unlearn`, the entry of every run: its argument checks, the copy of
``inplace=False``, the warning for a reused out dir, then the one run lifecycle
(``entangle_ext/unlearn/run.py``: evaluate the original model → the method's stages, e.g. Stage 1
→ evaluate → Stage 2 → evaluate → report; docs/algorithm.md §2, §3, §10)."""
from __future__ import annotations

import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import torch

from .._paths import expand_user
from .config import UnlearnConfig
from .data import Splits
from .disjoint import disjoint_scope
from .files import check_out_dir_type
from .distributed import unwrap
from .model_copy import copy_model
from .inputs import check_flags, check_model_and_splits, check_resume_arguments, training_flags_kept
from .method import get_method
from .report import UnlearnResult
from .run import run_method

__all__ = ["unlearn", "UnlearnResult", "OutDirReusedWarning"]


def unlearn(model: torch.nn.Module, splits: Splits, config: Optional[UnlearnConfig] = None, *,
            method: str = "two_stage", setting: Optional[str] = None, hparams: str = "paper_code",
            model_fn=None, seed: Optional[int] = None, device: Optional[Union[str, torch.device]] = None,
            out_dir: Optional[Union[str, Path]] = None,
            resume: Optional[Union[str, Path, Dict[str, Any]]] = None,
            allow_config_change: bool = False, inplace: bool = True,
            progress: bool = True) -> UnlearnResult:
    """Run the two-stage method (docs/algorithm.md §2, §3), or the baseline ``method``, on ``model``
    and report the three splits.

    Hyperparameters: ``config``; else the preset of ``setting`` (e.g. ``setting="digits"``); with
    neither, ``UnlearnConfig()`` = the CIFAR-100 preset (ResNet-18 scale: Stage-1 lr 2.5e-6,
    Stage-2 lr 2e-5 for 6 epochs of at most 10 forget/remote batches), which may change a small
    or different model very little: pass ``setting=`` or a config for anything else
    (docs/algorithm.md §8).

    Steps: evaluate θ0 on all splits (c0 = its remote-train mean CE; a non-finite per-sample loss
    stops here, naming the split and samples) → `stage1` (augmented Lagrangian) → evaluate →
    `stage2` (W-PGD) → evaluate → table, JSON report, histogram PNG.

    Args:
        model: a `torch.nn.Module` classifier returning (B, C) logits (tensor, tuple or object
            with ``.logits``); moved to ``device`` (it stays there); in eval mode during the run
            (a baseline may train some steps in train mode), and every submodule's ``training``
            flag is set back to what it was when ``unlearn`` returns or raises. float32/float64,
            or float16/bfloat16 (two-stage family: float32 master weights, optimizer state, λ,
            c0, μ; a baseline's torch optimizer steps float32 master copies of the weights too,
            `master_weight_optimizer`); floating inputs are cast to the model's dtype; any memory
            format (e.g. channels_last). Autograd is on for the call whatever the caller's mode
            (a call inside ``torch.no_grad()`` or ``torch.inference_mode()`` trains as outside).
        splits: `Splits` (forget/adjacent/remote train + optional held-out; Datasets or
            DataLoaders; ``adjacent`` may be None when ``config.run_stage2`` is False).
        config: `UnlearnConfig` (None: the preset of ``setting``, else ``UnlearnConfig()``, i.e.
            the CIFAR-100 hyperparameters, see above); validated here, so fields assigned after
            construction are checked too. For a baseline ``method``: that method's Config (None:
            its preset, docs/algorithm.md §10).
        method: a name of `entangle_ext.available_methods()`: "two_stage" (this method),
            its ablations "no_w2", "pgd_mean", "stage1_only", "two_stage_basis4" (rewrite the UnlearnConfig), or a
            baseline; every method runs through the same lifecycle (`entangle_ext.methods.run_method`),
            with the same checks, resume, seeding, evaluation and report structure.
        setting, hparams: when ``config`` is None, the preset of that setting ("digits",
            "cifar100", ...) in the family "paper_code" (the released code; recipe "reference")
            or "original" (the baseline authors' defaults; the paper's recipe for the two-stage
            family). Both are checked even when a config (or a resumed one) leaves them unused.
        model_fn: "retrain" only (a ValueError for any other method): a callable building a
            fresh `torch.nn.Module` (None: Retrain re-initialises ``model``).
        seed: the run's seed, replacing ``config.seed`` (of an explicit, preset or resumed
            config; None keeps it): data order, random labels, re-initialisation, every stream.
        device: "cpu"/"cuda"/torch.device (default: the model's device).
        out_dir: (a leading ``~`` is the home directory, here and in ``resume``) writes ``report.json``, ``forget_loss_hist.png``, ``history.json`` and
            ``checkpoints/`` (after each stage, every ``config.checkpoint_every`` steps, and on
            Ctrl-C / SIGTERM / SIGHUP). A directory that already holds a run (any of the files a
            run writes) is replaced, unless ``resume`` is given: an `OutDirReusedWarning`, then
            the old run's files are removed (report.json, history.json, the plots,
            selected_model.pt, and in ``checkpoints/`` the names a run writes, e.g.
            ``stage1_step000012.pt``, ``stage2_done.pt``, ``latest.pt``; other files stay, also a
            ``pretrained.pt`` of one's own there), once the call's checks have passed and before
            the run starts.
            One live run per dir: the run locks it (``OUT/.entangle_ext.lock``, an OS lock that
            ends with the process, so a killed run leaves no stale lock) from its checks to its
            return, and a second run into a locked dir raises `OutDirInUseError`.
        resume: checkpoint path / out dir / loaded dict; continues from that point (``config``
            None: the checkpoint's config), for every method. The checkpoint must have been
            written by ``method`` itself (not by another member of the two-stage family, nor a
            baseline), the splits must be those of the checkpoint, and the config too (except
            logging/checkpoint intervals, histogram bins, run_stage2); ``report["resume"]``
            records where the run resumed from.
        allow_config_change: with ``resume`` only (a ValueError without it): accept a config that
            differs from the checkpoint's (the differences are recorded in
            ``report["resume"]["config_changes"]``) and apply it from the resume point on (run
            objects saved in the checkpoint, e.g. optimizer state, a SalUn mask, keep their saved
            values; optimizer hyperparameters are the new config's).
        inplace: True (default): ``model`` itself is updated (its weights change); False: a deep
            copy is unlearned and returned, ``model`` is left untouched (not for FSDP models,
            which cannot be copied). When the call raises, ``model`` (with inplace=True) holds
            the weights of the last step taken — its original weights when no step was taken
            (the checks, pre-flight and evaluations change nothing) — and a checkpoint (with
            ``out_dir``) is what resumes; Retrain, whose steps train a re-initialised model,
            restores the original weights instead.
        progress: tqdm bars and, at the end, the result table printed to stdout (rank 0 only
            under several ranks).
    Several processes (``torchrun``; docs/algorithm.md §11): when `torch.distributed` is
    initialised with more than one rank, every rank calls ``unlearn`` with the same arguments and
    a DDP-wrapped, plain (replicated; broadcast from rank 0) or FSDP (``fully_shard``) model; the
    batch sizes of the config are global, the result equals one process's with the same seed (up
    to round-off), only rank 0 writes files and prints, and a resume needs the same number of
    ranks.
    Global state: the run seeds python/numpy/torch from ``config.seed`` (or ``seed``) and may switch
    deterministic algorithms on; every global setting it changes (generators, deterministic and
    cuDNN flags, thread count, CUBLAS_WORKSPACE_CONFIG) is restored on return, also on error.
    Returns:
        `UnlearnResult` (model, report, history, table); ``report["method"]``,
        ``report["evals"]["final"]`` (the last evaluation; with ``config.select`` and a kept
        state, the evaluation "selected" of that state, which the returned model holds),
        ``report["selected"]`` (None without ``select``), ``report["timings_s"]["unlearn"]``
        (seconds of unlearning, evaluation excluded) and ``report["hparams"]`` /
        ``report["setting"]`` (the preset the config came from; None for an explicit or resumed
        config) exist for every method.
    Warns:
        OutDirReusedWarning (a UserWarning, ``entangle_ext.OutDirReusedWarning``): ``out_dir``
            already holds a run and no ``resume`` is given; it names the files removed.
            Emitted after the config, splits and model have passed their checks (a call that
            raises for bad input does not also warn), before any training.
        SelectionWarning (``entangle_ext.SelectionWarning``): ``config.select`` found no probed
            state within its bounds; the model keeps its final state.
        UserWarning: ``config.checkpoint_every`` > 0 without ``out_dir`` (no checkpoint can be
            written).
    Raises:
        TypeError: ``model`` is not a `torch.nn.Module`, ``splits`` not a `Splits` (checked first);
            a ``model_fn`` that is not callable or (Retrain) returns no `torch.nn.Module`; an
            ``out_dir`` that is not a path (str or os.PathLike); an ``allow_config_change``,
            ``inplace`` or ``progress`` that is not a bool (``inplace="False"`` is truthy).
        ValueError: an unknown method, setting or hparams (checked before anything else, also
            when a config is given), ``model_fn`` for a method other than "retrain",
            ``allow_config_change=True`` without ``resume``,
            missing/empty splits, labels outside the model's classes or not integer,
            non-finite losses of the original model (every method, before any training; names
            split and samples), non 2-D logits, logits that are not real floating, have another
            number of rows than samples or fewer than 2 classes, a forward that detaches its
            logits (at the first gradient, before any parameter changes), a split whose inputs
            the model cannot take (wrong feature width, integer features; names the split, the
            input shape and dtype), a ``device`` this process cannot use (e.g. "cuda" without a
            GPU, "tpu", "meta") or torch does not know, a model with a tensor on the meta device
            or a parameter made under ``torch.inference_mode``, no trainable parameters (also a
            model without any parameter), a Retrain ``model_fn`` whose model's state dict does not
            fit ``model`` (before any training), an invalid config, a resume from a checkpoint of another method
            (names both), or whose splits or config differ, or whose model state does not fit
            ``model`` (another architecture or number of classes: names the mismatching
            parameters; checked before anything is loaded, ``model`` stays untouched)
            (TypeError for a wrong field type); an ``out_dir`` that exists and is not a
            directory, cannot be created (a parent is a file, no permission; the OS's reason is
            given) or is not writable.
        OutDirInUseError (a ValueError; ``entangle_ext.OutDirInUseError``): another
            live run (another process, or another thread) holds ``out_dir``; raised after the
            input checks, before any training or file written; names its pid, host, start time
            and command.
        NonFiniteLossError (a ValueError; ``entangle_ext.NonFiniteLossError``): NaN/Inf loss;
            names the stage and step; the last good checkpoint is kept (without one, the message
            says why none was written and what keeps one). Also when the final evaluation gives
            a NaN/Inf loss on a split (the weights diverged after the last checked step; no
            report is written).
        RunInterrupted (a KeyboardInterrupt; ``entangle_ext.RunInterrupted``): Ctrl-C / SIGTERM /
            SIGHUP (unless ignored, as under ``nohup``) during a stage; a checkpoint of the last
            completed step is written (with out_dir) and the message gives the call that resumes.
    """
    with disjoint_scope():   # the splits are checked again by the method and each evaluation
        check_model_and_splits(model, splits, "unlearn")
        check_out_dir_type(out_dir, "unlearn: out_dir")
        spec = get_method(method)
        spec.check_arguments(setting, hparams, model_fn)
        check_resume_arguments(resume, allow_config_change)
        out_dir, resume = expand_user(out_dir), expand_user(resume)   # "~/runs": the home directory
        check_flags("unlearn", inplace=inplace, progress=progress)
        if not inplace:
            model = _copy(model)
        # warned once the configuration and splits are known to be valid, at the caller's line
        warn = _reuse_warning(out_dir, sys._getframe(1)) if resume is None else None
        with training_flags_kept(model):
            return run_method(spec, model, splits, config, setting=setting, hparams=hparams, model_fn=model_fn,
                              seed=seed, device=device, out_dir=out_dir, resume=resume,
                              allow_config_change=allow_config_change, progress=progress, on_checked=warn)


class OutDirReusedWarning(UserWarning):
    """`unlearn` was given an ``out_dir`` that already holds a run, and no ``resume``: the run's
    files there (report, history, plots, selected model, checkpoints) are removed before it starts. Silence it with ``warnings.filterwarnings("ignore",
    category=entangle_ext.OutDirReusedWarning)``."""


#: What a run writes into its out dir (report.py, selection.py, run.py's curves, the checkpointer).
_RUN_FILES = ("report.json", "history.json", "forget_loss_hist.png", "curves.png", "selected_model.pt", "checkpoints")
#: The names of the files of ``checkpoints/`` a run writes: its checkpoints (``{label}_step000012``,
#: ``stage1_done``, a baseline's ``done``) as ``.pt`` files and sharded ``.dcp/`` folders, the
#: ``latest.pt`` pointer, and a killed write's ``{name}.{pid}.tmp``. Anything else a user keeps there
#: (``pretrained.pt``, ``epoch90.pt`` of their own training) is left alone: a ``*.pt`` glob deleted it.
_TAG = r"(?:[^/]+_step\d{6,}|(?:[^/]+_)?done)"
_CHECKPOINT_NAME = re.compile(rf"(?:(?:{_TAG}|latest)\.pt(?:\.\d+\.tmp)?|{_TAG}\.dcp)")


def _reuse_warning(out_dir, frame) -> Optional[Callable[[], None]]:
    """A callable that emits `OutDirReusedWarning` (rank 0 only), attributed to ``frame``'s line,
    and removes the previous run's files, when ``out_dir`` holds them; None when there is nothing
    to do. It is called after the run's configuration and splits have been checked, so a call that
    is refused neither warns nor removes anything. Removing them (rather than letting the new run
    overwrite them one by one) keeps a stopped or failed new run from sitting beside the old
    run's report.json, selected_model.pt, curves.png or later checkpoints, read as its own."""
    if out_dir is None or (torch.distributed.is_available() and torch.distributed.is_initialized()
                           and torch.distributed.get_rank() != 0):
        return None
    out = Path(out_dir)
    doomed = _run_files(out)
    if not doomed:   # (a checkpoints/ holding only the user's own files is no run)
        return None
    found = list(dict.fromkeys(p.name if p.parent == out else "checkpoints/" for p in doomed))
    state = "a finished run" if "report.json" in found else "an unfinished run"
    msg = (f"{out} already holds {state}; this run replaces it: its {', '.join(found)} are removed now. To "
           f"continue that run instead, pass resume={str(out)!r} (command line: --resume {out})")
    # no module_globals: linecache would ask the module's loader for the source, which fails for
    # a `python -m` __main__ frame (ImportError "loader ... cannot handle __main__")
    where = dict(filename=frame.f_code.co_filename, lineno=frame.f_lineno,
                 module=frame.f_globals.get("__name__"),
                 registry=frame.f_globals.setdefault("__warningregistry__", {}))

    def warn_and_remove() -> None:
        warnings.warn_explicit(msg, OutDirReusedWarning, **where)
        _remove_run_files(out, doomed)
    return warn_and_remove


def _run_files(out: Path) -> List[Path]:
    """The run files of ``out``: those of `_RUN_FILES` that are files (or symlinks), and in
    ``checkpoints/`` only the names of `_CHECKPOINT_NAME`. Only what a run writes: a directory or
    other non-file under a run file's name is not one (the run then fails writing it, naming it),
    and a ``checkpoints`` that is a symlink is not followed."""
    ck = out / "checkpoints"
    files = [out / n for n in _RUN_FILES[:-1] if (out / n).is_symlink() or (out / n).is_file()]
    if ck.is_dir() and not ck.is_symlink():
        files += sorted(p for p in ck.iterdir() if _CHECKPOINT_NAME.fullmatch(p.name))
    return files


def _remove_run_files(out: Path, doomed: List[Path]) -> None:
    """Delete ``doomed`` (`_run_files` of ``out``); OSError naming the file when one cannot be removed."""
    for p in doomed:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"out_dir {out} holds a previous run whose {p.name} cannot be removed "
                                   f"({e.strerror}); remove it yourself or choose another out_dir", str(p)) from e


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` (of the module a DDP wrapper holds); ValueError for FSDP."""
    model = unwrap(model)
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ValueError("inplace=False needs a copy of the model, and an FSDP (fully_shard) model "
                         "cannot be copied: pass inplace=True")
    return copy_model(model, "inplace=False runs on a copy of the model (pass inplace=True to update it in place)")
