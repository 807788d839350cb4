"""Precision of a run: the model's dtype, the dtype the stages keep their state in, opt-in autocast
of the forward passes, and float32 master copies of float16/bfloat16 parameters.

Rules (docs/algorithm.md §2, §3): floating inputs are cast to the model's dtype where batches are
made; per-sample losses are computed in float32 for float16/bfloat16 logits and in the logits'
dtype otherwise (float64 stays float64); the multiplier λ, c0, μ, the Stage-2 momentum buffer and
every optimizer state are kept in ``state_dtype`` = float32 for float16/bfloat16 parameters (the
parameter's dtype otherwise). With ``amp="bf16"`` every forward pass runs under
`torch.autocast(dtype=torch.bfloat16)` while parameters, gradients, optimizer state and the
Wasserstein-2 / projection arithmetic stay in the parameters' dtype.
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings
from typing import Iterator, List, Optional, Sequence

import torch

__all__ = ["LOW_PRECISION", "AMP_DTYPES", "AMP_CHOICES", "state_dtype", "model_dtype", "amp_scope",
           "autocast_for", "MasterParams", "master_weight_optimizer", "optimizer_tensor", "cpu_has_bf16_matmul",
           "resolve_amp", "resolve_run_amp", "resolve_amp_for"]

LOW_PRECISION = (torch.float16, torch.bfloat16)
#: The autocast dtype each resolved ``amp`` value selects (``amp_scope`` takes these keys).
AMP_DTYPES = {"bf16": torch.bfloat16}
#: What a config's ``amp`` field takes: an `AMP_DTYPES` key, or "auto" (`resolve_amp`).
AMP_CHOICES = tuple(AMP_DTYPES) + ("auto",)

_AMP: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("entangle_amp", default=None)


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware through oneDNN (AMX tiles or
    AVX-512-BF16), i.e. whether ``amp="bf16"`` can speed up CPU forward/backward passes (measured
    3.2x for a ResNet-18 at CIFAR shapes on an AMX Xeon, issue notes); False elsewhere (autocast
    would then emulate bfloat16 and be slower). Uses torch.cpu's capability queries (private in
    torch 2.13/2.14; False when they are missing)."""
    if not torch.backends.mkldnn.is_available():
        return False
    checks = [getattr(torch.cpu, n, None) for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(bool(c()) for c in checks if c is not None)


def resolve_amp(amp: Optional[str], device, dtype: Optional[torch.dtype] = torch.float32) -> Optional[str]:
    """The autocast a run on ``device`` of a model of ``dtype`` uses for a config's ``amp``: "auto"
    becomes "bf16" for a float32 model where the device multiplies bfloat16 matrices in hardware
    (a CPU with `cpu_has_bf16_matmul`, a CUDA device with ``torch.cuda.is_bf16_supported()``) and
    None elsewhere (float32 stays faster there); "bf16" stays "bf16" for a float32 model. Only a
    float32 model is autocast: for any other ``dtype`` (float64, which autocast does not lower;
    float16 / bfloat16, which run as they are; None, no floating parameter) both give None.
    None is returned as it is. Raises ValueError for any other value."""
    if amp is not None and amp not in AMP_CHOICES:
        raise ValueError(f"amp must be None or one of {list(AMP_CHOICES)}, got {amp!r}")
    if amp is None or dtype != torch.float32:
        return None
    if amp != "auto":
        return amp
    dev = torch.device(device)
    if dev.type == "cpu":
        return "bf16" if cpu_has_bf16_matmul() else None
    if dev.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else None
    return None


def resolve_run_amp(amp: Optional[str], device, dtype: Optional[torch.dtype]) -> Optional[str]:
    """`resolve_amp` for a run's config, with a warning (UserWarning) when an explicit "bf16"
    resolves to None because the model is not float32 (a float64 / float16 / bfloat16 model runs
    in its own dtype): the request is not silently dropped ("auto" falls back quietly, as
    documented)."""
    resolved = resolve_amp(amp, device, dtype)
    if amp == "bf16" and resolved is None:
        what = f"this {dtype} model runs in its own dtype" if dtype is not None else \
            "this model has no floating parameter and runs as it is"
        warnings.warn(f"amp='bf16' autocasts float32 models only: {what}, without autocast (the report's amp is "
                      "None)", UserWarning, stacklevel=3)
    return resolved


def resolve_amp_for(amp: Optional[str], model: torch.nn.Module, device=None) -> Optional[str]:
    """`resolve_amp` for ``model`` run on ``device`` (None: where its first parameter or buffer
    is, else the CPU), with the model's dtype."""
    if device is None:
        device = next((t.device for t in list(model.parameters()) + list(model.buffers())), torch.device("cpu"))
    return resolve_amp(amp, device, model_dtype(model))


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16, the dtype itself for float32/float64."""
    return torch.promote_types(dtype, torch.float32)


def model_dtype(model: torch.nn.Module) -> Optional[torch.dtype]:
    """dtype of the first floating parameter (else buffer) of ``model``; None when it has none."""
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


@contextlib.contextmanager
def amp_scope(amp: Optional[str]) -> Iterator[None]:
    """Within the block, `autocast_for` (used by every forward pass of the package) autocasts to
    ``AMP_DTYPES[amp]``; ``amp=None`` turns it off. Restored on exit (also on error).

    Raises ValueError for an unknown ``amp``.
    """
    if amp is not None and amp not in AMP_DTYPES:
        raise ValueError(f"amp must be None or one of {sorted(AMP_DTYPES)}, got {amp!r}")
    token = _AMP.set(amp)
    try:
        yield
    finally:
        _AMP.reset(token)


def autocast_for(device_type: str):
    """The autocast context of the current `amp_scope` for ``device_type`` (a null context when
    autocast is off)."""
    amp = _AMP.get()
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=AMP_DTYPES[amp])


class MasterParams:
    """The tensors an optimizer updates for a list of trainable parameters: the parameters
    themselves when they are float32/float64, float32 copies ("master weights") of float16/bfloat16
    ones, written back (rounded) into the parameters after every step.

    Attributes:
        params: the model's trainable parameters. tensors: what the optimizer owns (same order).
        low: True when at least one copy exists; then ``tensors`` belongs in a checkpoint.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = list(params)
        self.tensors: List[torch.Tensor] = [
            p.detach().to(state_dtype(p.dtype), copy=True) if p.dtype in LOW_PRECISION else p
            for p in self.params]
        self.low = any(m is not p for m, p in zip(self.tensors, self.params))

    def step(self, opt: torch.optim.Optimizer, grads: Sequence[Optional[torch.Tensor]]) -> None:
        """``opt.step()`` with ``grads`` (None = no gradient: the optimizer skips that tensor) as
        the ``.grad`` of `tensors` (cast to their dtype), then the parameters updated from the
        copies; ``.grad`` is cleared afterwards."""
        for m, g in zip(self.tensors, grads):
            m.grad = None if g is None else g if g.dtype == m.dtype else g.to(m.dtype)
        opt.step()
        for m in self.tensors:
            m.grad = None
        if self.low:
            with torch.no_grad():
                for p, m in zip(self.params, self.tensors):
                    if m is not p:
                        p.copy_(m)


_MASTER_KEY = "entangle_master_weights"


def master_weight_optimizer(cls, params: Sequence[torch.Tensor], **kw) -> torch.optim.Optimizer:
    """``cls(tensors, **kw)`` (a `torch.optim` optimizer class) over `MasterParams` ``(params)``:
    float32 master copies of the float16/bfloat16 entries, the parameters themselves otherwise
    (then it is exactly ``cls(params, **kw)``). Used by the baselines and `train_original`, which
    call ``zero_grad`` / ``backward`` / ``step`` as usual:

    * ``step()`` first moves each low-precision parameter's ``.grad`` to its master copy (as
      float32; the parameter's ``.grad`` is cleared), steps, then writes the masters back into
      the parameters (rounded). Adam's ``eps = 1e-8`` (0 in float16: 0/0 = NaN on a zero
      gradient) and small steps (rounded away in float16/bfloat16) then act in float32.
    * ``zero_grad()`` also clears the parameters' gradients.
    * ``state_dict()`` carries the master copies, ``load_state_dict()`` restores them (and the
      parameters from them), so a resumed run continues from the same float32 weights; a state
      without them (written by a plain optimizer) makes the next ``step()`` take the masters
      from the parameters as they are then.

    ``opt.entangle_master`` is the `MasterParams` (absent when no copy exists)."""
    master = MasterParams(params)
    opt = cls(master.tensors, **kw)
    if not master.low:
        return opt
    pairs = [(p, m) for p, m in zip(master.params, master.tensors) if m is not p]
    opt.entangle_master = master

    resync = [False]   # a state without master copies was loaded: take them from the parameters

    def to_masters(_opt, _args, _kwargs):
        for p, m in pairs:
            if resync[0]:
                with torch.no_grad():
                    m.copy_(p)
            m.grad = None if p.grad is None else p.grad.detach().to(m.dtype)
            p.grad = None
        resync[0] = False

    @torch.no_grad()
    def from_masters(_opt, _args, _kwargs):
        for p, m in pairs:
            p.copy_(m)
            m.grad = None

    plain_zero_grad = opt.zero_grad

    def zero_grad(set_to_none: bool = True) -> None:
        plain_zero_grad(set_to_none=set_to_none)
        for p, _ in pairs:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def save_masters(_opt, state):
        state[_MASTER_KEY] = [m.detach().clone() for _, m in pairs]
        return state

    @torch.no_grad()
    def load_masters(_opt, state):
        state = dict(state)
        saved = state.pop(_MASTER_KEY, None)
        resync[0] = saved is None   # e.g. a checkpoint written before master copies existed
        if saved is not None:
            if len(saved) != len(pairs) or any(s.shape != m.shape for s, (_, m) in zip(saved, pairs)):
                raise ValueError("optimizer state: its float32 master weights do not match this model's "
                                 "float16/bfloat16 parameters")
            for s, (p, m) in zip(saved, pairs):
                m.copy_(s)
                p.copy_(m)
        return state

    opt.register_step_pre_hook(to_masters)
    opt.register_step_post_hook(from_masters)
    opt.register_state_dict_post_hook(save_masters)
    opt.register_load_state_dict_pre_hook(load_masters)
    opt.zero_grad = zero_grad
    return opt


def optimizer_tensor(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    """The tensor ``opt`` updates for parameter ``p``: its float32 master copy under
    `master_weight_optimizer`, ``p`` itself otherwise."""
    master = getattr(opt, "entangle_master", None)
    if master is None:
        return p
    for q, m in zip(master.params, master.tensors):
        if q is p:
            return m
    return p
