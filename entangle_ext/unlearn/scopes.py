"""One mechanism for the package's joining context scopes (`disjoint_scope`, `batch_warning_scope`,
`original_eval_scope`): a context variable that holds a state object while a scope is open and
None outside one; a scope opened inside another joins it (keeps the outer state)."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, Optional

__all__ = ["joined_scope"]


@contextlib.contextmanager
def joined_scope(var: contextvars.ContextVar, fresh: Callable[[], Any]) -> Iterator[None]:
    """Set ``var`` to ``fresh()`` for the body unless a scope of it is already open (then join
    that one); reset it on exit (also on error) only where this call set it."""
    token: Optional[contextvars.Token] = var.set(fresh()) if var.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            var.reset(token)
