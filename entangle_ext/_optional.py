"""Imports of optional dependencies with an install hint naming the package extra."""
from __future__ import annotations

import importlib
from types import ModuleType

_PACKAGE = {"sklearn": "scikit-learn"}


def optional_import(module: str, what: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``; ImportError naming ``what`` needs it and the
    ``pip install 'entangle_ext[extra]'`` that brings it when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        pkg = _PACKAGE.get(top, top)
        raise ImportError(f"{what} needs {pkg}, an optional dependency of entangle_ext: "
                          f"pip install --no-build-isolation '.[{extra}]' in the source tree "
                          f"(or pip install {pkg})") from e
