"""What every entry point asks of the caller's model and splits, and what it gives back: their
types, the device a call runs on, the trainable parameters, and the model's train/eval flags,
restored on exit (docs/algorithm.md §1). One home for these checks, shared by `unlearn`, the
one run lifecycle (`unlearn/run.py`), `stage1` / `stage2`, `evaluate`, the metrics and `compare`."""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional

import torch

from .fields import SEED_MAX, SEED_MIN
from .batch import logits_of, model_output
from .data import BatchStream, Splits, split_batch
from .losses import trainable_params
from .memory_format import resolve_channels_last
from .module_state import state_module, unwrapped_state
from .precision import amp_scope, model_dtype, state_dtype

__all__ = ["check_model_and_splits", "model_device", "check_device_usable", "preflight", "probe_channels_last",
           "require_trainable", "require_one_dtype", "training_flags_kept", "training_grad_mode", "check_flags",
           "check_stage_arguments", "check_resume_arguments", "check_changes_apply", "check_resume_model",
           "state_dict_mismatch"]


def check_model_and_splits(model, splits, where: str) -> None:
    """Raise TypeError, naming ``where`` (e.g. "unlearn"), unless ``model`` is a `torch.nn.Module`
    and ``splits`` an `entangle_ext.Splits` (e.g. for a bare Dataset passed as ``splits``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(splits, Splits):
        raise TypeError(f"{where}: splits must be an entangle_ext.Splits, got {type(splits).__name__}")


def model_device(model: torch.nn.Module, device=None) -> torch.device:
    """``device`` as a `torch.device` (`check_device_usable`); None: the device of the model's first
    parameter, else of its first buffer. Raises ValueError when ``device`` is None and the model has
    neither (a module without state has no device of its own: pass ``device=``), when ``device`` is
    not a device this process can run on, and when the model holds a parameter or buffer on the
    meta device (no values: nothing to unlearn from)."""
    meta = next((n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta), None)
    if meta is not None:
        raise ValueError(f"the model ({type(model).__name__}) has tensors on the meta device (e.g. {meta!r}), "
                         "which hold no values: materialise it first (model.to_empty(device='cpu') and then "
                         "load_state_dict of the trained weights)")
    if device is not None:
        return check_device_usable(device)
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    raise ValueError(f"the model ({type(model).__name__}) has no parameters and no buffers, so it has no "
                     "device to run on: pass device= (e.g. device='cpu')")


def check_device_usable(device) -> torch.device:
    """``device`` (a `torch.device`, a string such as "cpu", "cuda:1", or a CUDA index) as a
    `torch.device`, or ValueError naming it when it is not a device string torch knows (e.g.
    "gpu", "tpu:0"), or this process cannot run on it: a CUDA device without a usable GPU (or an
    index past the GPUs visible), an MPS device without MPS, the meta device (no values), any
    other device type on which an empty tensor cannot be made (e.g. "xla" without torch_xla; with
    an add-on backend that registers it, it is accepted) — instead of the run's error at the first
    tensor moved there."""
    try:
        device = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"device {device!r} is not a device torch knows (e.g. 'cpu', 'cuda', 'cuda:1'): "
                         f"{str(e).splitlines()[0]}") from None
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
            raise ValueError(f"device {str(device)!r}: no CUDA GPU is usable here (torch {torch.__version__}, "
                             f"{build}; torch.cuda.is_available() is False): pass device='cpu'")
        if device.index is not None and device.index >= n:
            raise ValueError(f"device {str(device)!r}: only {n} CUDA GPU(s) are visible (cuda:0..cuda:{n - 1})")
    elif device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device {str(device)!r}: MPS is not available here: pass device='cpu'")
    elif device.type == "meta":
        raise ValueError(f"device {str(device)!r}: the meta device holds no values, so nothing can be trained "
                         "or evaluated on it: pass device='cpu' or a GPU")
    elif device.type != "cpu":   # xla, xpu, hpu, privateuseone...: usable if a tensor can be made there
        try:
            torch.empty(0, device=device)
        except Exception as e:   # torch's error differs per backend: absent, not linked, no device
            raise ValueError(f"device {str(device)!r}: this torch ({torch.__version__}) cannot make a tensor there "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): pass device='cpu' or "
                             "a GPU") from None
    return device


@contextlib.contextmanager
def training_grad_mode() -> Iterator[None]:
    """Context manager (also a function decorator): autograd on inside, whatever the caller's mode
    — a training entry point (`entangle_ext.unlearn`, `stage1`, `stage2`, `train_original`,
    `relearn_time`) called under ``torch.no_grad()`` or ``torch.inference_mode()`` still computes
    its gradients (``torch.inference_mode(False)`` + ``torch.enable_grad()``); the caller's mode is
    back on exit. The evaluation passes inside turn gradients off themselves."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def require_trainable(model: torch.nn.Module, *, copied: bool = False) -> List[torch.nn.Parameter]:
    """The trainable parameters of ``model`` (`trainable_params`). Raises ValueError when there are
    none (a model without parameters, or with ``requires_grad`` False for all of them), when one
    was created under ``torch.inference_mode`` (an inference tensor cannot be trained; not checked
    with ``copied``: the methods train a `copy_model` copy, whose tensors are normal ones), or when a
    trainable `torch.nn.Embedding` / `EmbeddingBag` has ``sparse=True`` (sparse gradients)."""
    params = trainable_params(model)
    if not params:
        why = "it has no parameters at all" if next(model.parameters(), None) is None else \
            "requires_grad is False for all of them"
        raise ValueError(f"the model has no trainable parameters ({why}): nothing for unlearning to change")
    sparse = next((n for n, m in model.named_modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                   and m.sparse and m.weight.requires_grad), None)
    if sparse is not None:
        raise ValueError(f"the model's embedding {sparse!r} has sparse=True, whose sparse gradients the methods cannot "
                         "use (Adam, the projections and the dual update need dense ones): build it with "
                         "sparse=False (the weights stay the same)")
    frozen = None if copied else next((n for n, p in model.named_parameters() if p.requires_grad and p.is_inference()),
                                      None)
    if frozen is not None:
        raise ValueError(f"the model's parameter {frozen!r} is an inference tensor (the model was built or loaded "
                         "under torch.inference_mode), which autograd cannot train: build or load the model "
                         "outside inference_mode")
    return params


def require_one_dtype(params: List[torch.nn.Parameter], model: torch.nn.Module, where: str = "stage 2") -> None:
    """ValueError, naming a parameter of each dtype, when the gradients of the trainable ``params``
    of ``model`` come in more than one dtype: Stage 2 projects the adjacent gradient against the
    forget and remote gradients over all of them at once (docs/algorithm.md §5), in one dtype. A
    float16 / bfloat16 parameter's gradient is its float32 master copy's (`state_dtype`), so
    float32 with bfloat16 is one dtype; float32 with float64 is two. The two-stage family checks
    this before the model is moved or any file written (`TwoStage.check_model`)."""
    first = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for p in params:
        first.setdefault(state_dtype(p.dtype), (names.get(id(p), "?"), p.dtype))
    if len(first) > 1:
        raise ValueError(f"{where}: the trainable parameters' gradients are of {len(first)} dtypes (" +
                         ", ".join(f"{n!r}: {d}" for n, d in first.values()) +
                         "), and the W-PGD projection takes them in one: cast the model to one dtype (e.g. "
                         "model.float()) or freeze the parameters of the other (requires_grad=False)")


@contextlib.contextmanager
def training_flags_kept(model: Optional[torch.nn.Module]) -> Iterator[None]:
    """Context manager: every submodule's ``training`` flag is set back on exit (also on error),
    one by one (``train()`` overrides, e.g. frozen blocks kept in eval mode, are respected).
    ``model`` None: nothing to keep."""
    flags = [] if model is None else [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


@torch.no_grad()
def preflight(model, splits: Splits, device, amp=None) -> int:
    """Probe one batch of two samples per split (every entry point: the two-stage family and the
    baselines) before any compute; the caller has checked the trainable parameters
    (`require_trainable`) and put the model in eval mode (so no batch-norm statistics move). Each
    probe (no autograd) checks: the model takes the split's inputs; its output is (B, C) logits
    with one row per sample, C >= 2, of a floating dtype; and the train splits' batches share one
    form (`_batch_form`: the methods concatenate them, e.g. Stage 1's remote and forget batches).
    The labels themselves (integer 1-D class indices within C) are checked by the batches and the
    evaluation; logits without an autograd graph (a forward that detaches) by the first gradient
    (`require_graph`). Returns C; raises ValueError naming the split otherwise."""
    C, forms = None, {}
    with amp_scope(amp):
        for name in splits.named():
            probe = BatchStream(splits.source(name), 2, shuffle=False, seed=0, name=f"probe/{name}",
                                device=device, input_dtype=model_dtype(model))
            inputs, y = split_batch(probe.fetch(torch.arange(min(2, probe.n))), name)
            if name in Splits.TRAIN:
                forms[name] = _batch_form(inputs)
                if len(set(forms.values())) > 1:
                    raise ValueError("the train splits give batches of different forms, which the methods cannot "
                                     "concatenate (e.g. Stage 1's remote and forget batches): " +
                                     "; ".join(f"split {n!r}: {f}" for n, f in forms.items()) +
                                     ". Give every train split items of one form (all (x, y) tuples, or all "
                                     "dicts with the same keys)")
            try:
                out = model_output(model, inputs)
            except (RuntimeError, TypeError, IndexError) as e:
                raise ValueError(f"split {name!r}: the model ({type(model).__name__}) cannot take this split's "
                                 f"inputs ({describe_inputs(inputs)}; the model's parameters are "
                                 f"{_param_dtypes(model)}): {str(e).splitlines()[0]}") from e
            if C is None:   # once per run: the form of the output is the same for every split
                _warn_ambiguous_tuple(model, out, len(y))
            logits = logits_of(out, lone=len(y) == 1)
            what = f"split {name!r}: the model ({type(model).__name__}) returned logits of shape " \
                   f"{tuple(logits.shape)} and dtype {logits.dtype} for {len(y)} samples"
            if logits.shape[0] != len(y):
                raise ValueError(f"{what}: expected one row per sample ({len(y)}, classes); a forward that "
                                 "reshapes, pools or indexes across the batch dimension cannot be trained per sample")
            if not (logits.is_floating_point() and not logits.is_complex()):
                raise ValueError(f"{what}: logits must be a real floating dtype (the unnormalised class scores "
                                 "the cross-entropy takes), not class indices or integer scores")
            if logits.shape[1] < 2:
                raise ValueError(f"{what}: a classifier needs at least 2 classes (a single-logit binary head "
                                 "is not supported: return two logits, e.g. torch.cat([-z, z], 1) / 2)")
            C = logits.shape[1] if C is None else C
    return C


def _warn_ambiguous_tuple(model, out, rows: int) -> None:
    """UserWarning when the model returns a tuple / list holding more than one (rows, k) floating
    tensor: the package takes element 0 as the logits (`logits_of`), which for a model returning
    ``(features, logits)`` would be its features, trained on and scored silently."""
    if not isinstance(out, (tuple, list)) or hasattr(out, "logits"):   # a namedtuple with .logits: that is taken
        return
    cands = [i for i, v in enumerate(out) if isinstance(v, torch.Tensor) and v.dim() == 2
             and v.shape[0] == rows and v.is_floating_point()]
    if len(cands) > 1 and cands[0] == 0:   # (element 0 not a (batch, k) tensor: logits_of refuses it)
        shapes = ", ".join(f"{i}: (batch, {out[i].shape[1]})" for i in cands)
        warnings.warn(f"the model ({type(model).__name__}) returns a {type(out).__name__} of {len(out)} "
                      f"with several (batch, k) tensors ({shapes}): element 0 is taken as the logits, "
                      f"{out[0].shape[1]} classes. If the logits are another element, return them first, "
                      "alone, or as out['logits'] / out.logits", UserWarning, stacklevel=2)


@torch.no_grad()
def probe_channels_last(setting, model, splits: Splits, device, amp=None) -> bool:
    """What a run config's ``channels_last`` runs as (`resolve_channels_last` of
    entangle_ext/unlearn/memory_format.py) for ``model`` on ``device``, probed on two samples of
    the first split under the run's ``amp`` (after `preflight`; the model in eval mode). Raises
    ValueError as `resolve_channels_last` (``channels_last=True`` on a model that fails on
    channels-last inputs)."""
    if setting is False:
        return False
    name = next(iter(splits.named()))
    with amp_scope(amp):
        probe = BatchStream(splits.source(name), 2, shuffle=False, seed=0, name=f"probe/{name}",
                            device=device, input_dtype=model_dtype(model))
        inputs, _ = split_batch(probe.fetch(torch.arange(min(2, probe.n))))
        return resolve_channels_last(setting, model, inputs, device)


def _param_dtypes(model: torch.nn.Module) -> str:
    """The dtypes of the model's parameters, e.g. "torch.float32" or "torch.complex64, torch.float32"
    (`model_dtype` sees floating ones only, and said None for a complex model)."""
    return ", ".join(sorted({str(p.dtype) for p in model.parameters()})) or "none (no parameters)"


def _batch_form(inputs) -> str:
    """The form of a batch's inputs, as two batches that concatenate share it: "a tensor", "dict
    keys [...]" or "a sequence of n" (a tuple or a list)."""
    if isinstance(inputs, dict):
        return f"dict keys {sorted(inputs)}"
    if isinstance(inputs, (tuple, list)):   # default_collate makes lists of tuple items: one form
        return f"a sequence of {len(inputs)}"
    return "a tensor" if torch.is_tensor(inputs) else type(inputs).__name__


def describe_inputs(inputs) -> str:
    """``shape (2, 63) torch.float32`` for a tensor; the same per entry for a tuple/list/dict."""
    if torch.is_tensor(inputs):
        return f"shape {tuple(inputs.shape)} {inputs.dtype}"
    if isinstance(inputs, dict):
        return ", ".join(f"{k}: {describe_inputs(v)}" for k, v in inputs.items())
    if isinstance(inputs, (tuple, list)):
        return ", ".join(describe_inputs(v) for v in inputs)
    return type(inputs).__name__


def check_flags(where: str, **flags) -> None:
    """TypeError naming ``where`` and the argument for each of ``flags`` that is not a bool (a
    string such as "False" is truthy: ``inplace="False"`` would update the model in place)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {name} must be True or False, got {type(value).__name__} {value!r}")


def check_stage_arguments(where: str, model, splits, config, config_cls: type, *, seed, c0=None,
                          checkpoint_fn=None, progress=True) -> None:
    """The arguments of the public stage functions (`stage1`, `stage2`) that `unlearn` checks for
    its own callers: TypeError for a model or splits of another type (`check_model_and_splits`),
    a ``config`` that is not a ``config_cls`` (e.g. a whole `UnlearnConfig` where its ``stage1``
    belongs), a ``seed`` that is not an int, a ``c0`` that is not a real number, a
    ``checkpoint_fn`` that is not callable, a non-bool ``progress``; ValueError for a ``seed``
    outside torch.manual_seed's range or a non-finite ``c0``."""
    check_model_and_splits(model, splits, where)
    if not isinstance(config, config_cls):
        hint = f" (a run config's .{where} is one)" if where in ("stage1", "stage2") else ""
        raise TypeError(f"{where}: config must be a {config_cls.__name__}{hint}, got {type(config).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{where}: seed must be an int, got {type(seed).__name__} {seed!r}")
    if not SEED_MIN <= seed <= SEED_MAX:
        raise ValueError(f"{where}: seed must be in [{SEED_MIN}, {SEED_MAX}] (torch.manual_seed's range), got {seed}")
    if c0 is not None:
        if isinstance(c0, bool) or not (isinstance(c0, numbers.Real) or (torch.is_tensor(c0) and c0.numel() == 1
                                                                         and not c0.is_complex())):
            raise TypeError(f"{where}: c0 must be a real number (nats) or None, got {type(c0).__name__} {c0!r}")
        if not math.isfinite(float(c0)):
            raise ValueError(f"{where}: c0 must be finite (nats), got {c0}")
    if checkpoint_fn is not None and not callable(checkpoint_fn):
        raise TypeError(f"{where}: checkpoint_fn must be callable (step, state) or None, got "
                        f"{type(checkpoint_fn).__name__} {checkpoint_fn!r}")
    check_flags(where, progress=progress)


def check_resume_arguments(resume, allow_config_change) -> None:
    """The ``resume`` and ``allow_config_change`` of `unlearn` and `run_method` (every method, the
    baselines too): TypeError for a ``resume`` that is not None, a path (str or os.PathLike) or a
    loaded checkpoint (dict), and for a non-bool ``allow_config_change``; ValueError for an empty
    ``resume`` path, and for ``allow_config_change=True`` without ``resume`` (it only changes what a
    resume accepts), as the command line refuses ``--allow-config-change`` without ``--resume``."""
    if resume is not None and not isinstance(resume, (dict, str, os.PathLike)):
        raise TypeError(f"resume must be a checkpoint file, an out dir (str or os.PathLike), a loaded checkpoint "
                        f"(dict) or None, got {type(resume).__name__} {resume!r}")
    if isinstance(resume, (str, os.PathLike)) and os.fspath(resume) == "":
        raise ValueError("resume is an empty path: give the checkpoint file or the out dir of the run to resume")
    check_flags("unlearn", allow_config_change=allow_config_change)
    if allow_config_change and resume is None:
        raise ValueError("allow_config_change=True applies to a resumed run only: give resume= too (a checkpoint "
                         "file, an out dir or a loaded checkpoint; command line: --allow-config-change with --resume)")


def check_changes_apply(ckpt: Dict[str, Any], changes: Optional[Dict[str, List[Any]]], last_stage: Any) -> None:
    """ValueError when a resume with ``allow_config_change`` changes the config (``changes``, as
    `check_resume` returns them) of a finished run: the checkpoint is the end of the method's last
    stage (``last_stage``), so no stage runs again and the changes would not apply, while the
    report would record them (e.g. ``stage2.epochs`` 20 → 25 with Stage 2's 20 epochs done)."""
    if changes and ckpt.get("stage") == last_stage and ckpt.get("stage_done"):
        shown = "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in changes.items())
        raise ValueError(f"resume: the checkpoint ({ckpt.get('path', 'given')}) is the end of a finished run, so no "
                         f"stage runs again and the config changes ({shown}) would not apply: resume from an earlier "
                         "checkpoint (e.g. checkpoints/stage1_done.pt, or a mid-stage one) or start a new run")


def state_dict_mismatch(saved: Dict[str, Any], own: Dict[str, Any], *, saved_name: str, own_name: str) -> List[str]:
    """What keeps state dict ``saved`` from loading into one shaped as ``own`` (names of the two in
    the messages, e.g. "the checkpoint" / "the model"): entries of other shapes, entries missing
    from ``own``, entries of ``own`` not in ``saved`` (each list cut to 8, with a count of the
    rest). Empty when they fit."""
    shown = lambda names: ", ".join(repr(n) for n in names[:8]) + (f" (+{len(names) - 8} more)"
                                                                  if len(names) > 8 else "")
    parts = []
    shapes = [f"{k!r}: {tuple(v.shape)} in {saved_name} vs {tuple(own[k].shape)} in {own_name}"
              for k, v in saved.items() if k in own and isinstance(v, torch.Tensor)
              and isinstance(own[k], torch.Tensor) and tuple(v.shape) != tuple(own[k].shape)]
    if shapes:
        parts.append("other shapes: " + "; ".join(shapes[:8]) +
                     (f" (+{len(shapes) - 8} more)" if len(shapes) > 8 else ""))
    missing = sorted(set(saved) - set(own))
    if missing:
        parts.append(f"missing from {own_name}: " + shown(missing))
    extra = sorted(set(own) - set(saved))
    if extra:
        parts.append(f"not in {saved_name}: " + shown(extra))
    return parts


def check_resume_model(ckpt: Dict[str, Any], model: torch.nn.Module) -> None:
    """ValueError when the model state a checkpoint holds (its ``model`` and ``selected_model``
    entries) does not fit ``model``: a parameter or buffer missing on either side, or of another
    shape (e.g. another number of classes). Runs before anything is loaded into ``model``, so a
    refused resume leaves it untouched; the message names the mismatching entries (entries kept
    in a sharded checkpoint directory are checked by the sharded load itself). A compiled model
    (``torch.compile``) and its checkpoints are compared by the state of the module underneath
    (`state_module`), so either form resumes the other's checkpoint."""
    own = state_module(model).state_dict()
    for entry in ("model", "selected_model"):
        saved = ckpt.get(entry)
        if not isinstance(saved, dict):
            continue
        parts = state_dict_mismatch(unwrapped_state(saved), own, saved_name="the checkpoint", own_name="the model")
        if parts:
            raise ValueError(f"resume: the checkpoint's model does not fit the model given (another architecture "
                             f"or number of classes; checkpoint entry {entry!r}): " + "; ".join(parts) +
                             ". Resume with a model built as the checkpoint's run built it, or start a new run "
                             "without resume (command line: without --resume, in a fresh --out)")
