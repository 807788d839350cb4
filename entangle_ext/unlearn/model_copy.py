"""`copy_model`: the deep copy of a user's model that ``inplace=False``, `compare`, SCRUB's teacher and
the relearn-time metric need, with an error that says why the copy was needed and which attribute
could not be copied."""
from __future__ import annotations

import copy
from typing import Optional

import torch

__all__ = ["copy_model"]


def copy_model(model: torch.nn.Module, why: str) -> torch.nn.Module:
    """``copy.deepcopy(model)``, or TypeError naming ``why`` the copy is needed (e.g. "inplace=False
    runs on a copy of the model") and the attribute that cannot be copied (it holds a lock, a file or
    socket handle, a non-leaf tensor, ...), instead of the copy module's error from deep inside the
    model's attributes. Out of memory is re-raised as it is. The copy is made with inference mode
    off: under a caller's ``torch.inference_mode()`` its parameters would be inference tensors,
    which cannot be trained (the run trains outside that mode; `training_grad_mode`)."""
    try:
        with torch.inference_mode(False):
            return copy.deepcopy(model)
    except (MemoryError, torch.OutOfMemoryError):   # out of memory is not "cannot be copied"
        raise
    except Exception as e:   # pickling / copying errors of any attribute: TypeError, RuntimeError, ...
        culprit = _uncopyable_attribute(model)
        where = (f"; the attribute that cannot be copied is {culprit}. Make it deep-copyable (drop it, or "
                 "recreate it in the module's __deepcopy__)" if culprit else
                 ". Make it deep-copyable (e.g. define __deepcopy__ for the attribute that holds it)")
        raise TypeError(f"{why}, and the model ({type(model).__name__}) cannot be copied with copy.deepcopy: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{where}") from e


def _uncopyable_attribute(model: torch.nn.Module) -> Optional[str]:
    """``model.<path>`` (and its type) of the first plain attribute of the model or a submodule that
    ``copy.deepcopy`` refuses; None when each copies alone (then the model's own __deepcopy__ or
    the combination fails). Parameters, buffers and submodules are walked, not copied whole."""
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if name in ("_parameters", "_buffers", "_modules"):
                continue
            try:
                copy.deepcopy(value)
            except Exception:   # the first attribute copy refuses
                path = ".".join(p for p in ("model", prefix, name) if p)
                return f"{path} (a {type(value).__name__})"
    return None
