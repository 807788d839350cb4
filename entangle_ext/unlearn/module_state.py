"""The module whose state a model holds. ``torch.compile(model)`` returns a wrapper (an
``OptimizedModule``) whose ``state_dict()`` holds the model's entries under the prefix ``_orig_mod.``;
checkpoints, the kept state of ``select``, cached original models and the model fingerprint hold
the state of the module underneath (`state_module`), so a run interrupted with a plain model resumes
with ``torch.compile(model)`` and the reverse, and a file written from a compiled run loads into a
plain model. The run itself goes on calling the model as given (compiled)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

__all__ = ["state_module", "unwrapped_state", "COMPILED_ATTR"]

#: The attribute under which torch.compile's wrapper holds the compiled module (and the prefix of
#: the wrapper's state-dict keys).
COMPILED_ATTR = "_orig_mod"


def state_module(model: Any) -> Any:
    """The module whose state ``model`` holds: the module under torch.compile's wrappers (an
    ``_orig_mod`` attribute that is a `torch.nn.Module`, duck-typed), else ``model`` itself (also
    for anything that is not a module: an optimizer, a list of tensors)."""
    while isinstance(getattr(model, COMPILED_ATTR, None), torch.nn.Module):
        model = getattr(model, COMPILED_ATTR)
    return model


def unwrapped_state(state: Any) -> Any:
    """A model state dict without torch.compile's ``_orig_mod.`` key prefix when every key carries
    it (one written from a compiled model's own ``state_dict()``, e.g. by an earlier version of
    entangle_ext or by the caller), its ``_metadata`` (module versions) renamed alike; any other
    ``state`` as it is."""
    prefix = COMPILED_ATTR + "."
    while isinstance(state, dict) and state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
        meta = getattr(state, "_metadata", None)
        state = OrderedDict((k[len(prefix):], v) for k, v in state.items())
        if meta is not None:
            state._metadata = OrderedDict(("" if k == COMPILED_ATTR else k[len(prefix):], v) for k, v in meta.items()
                                          if k == COMPILED_ATTR or k.startswith(prefix))
    return state
