"""What a user reaches from ``import entangle_ext``: the exceptions and warning a run raises, the
method list, every ``entangle_ext.…`` path that a docstring or ``--help`` names (the functions
``entangle_ext.unlearn`` / ``entangle_ext.compare`` hide their subpackage/module as attributes),
the ``compare`` subcommand in the top-level help, and the default hyperparameters of `unlearn`."""
import importlib
import inspect
import pkgutil
import re

import pytest

import entangle_ext as ee
from entangle_ext import cli
from entangle_ext.cli import compare as cli_compare

# "entangle_ext.a.b" (used as attributes after ``import entangle_ext.a``) or
# "from entangle_ext.a import b"; not inside a file path or another dotted name (torch.ops.entangle_ext.x)
REF = re.compile(r"(?<![\w./])(from\s+)?(entangle_ext(?:\.\w+)+)(?:\s+import\s+(\w+))?")


def test_exceptions_warning_and_methods_at_the_top_level():
    from entangle_ext.methods import available_methods
    from entangle_ext.unlearn import loop
    assert ee.NonFiniteLossError is loop.NonFiniteLossError and issubclass(ee.NonFiniteLossError, ValueError)
    assert ee.RunInterrupted is loop.RunInterrupted and issubclass(ee.RunInterrupted, KeyboardInterrupt)
    assert issubclass(ee.OutDirReusedWarning, UserWarning)
    assert ee.available_methods() == available_methods() and "two_stage" in ee.available_methods()
    assert {"NonFiniteLossError", "RunInterrupted", "OutDirReusedWarning", "available_methods"} <= set(ee.__all__)


def test_every_warning_and_run_error_is_importable_from_the_top_level():
    """README names OverlappingSplitsWarning, BatchLargerThanSplitWarning, PlotSkippedWarning and
    WriteError, but they lived in submodules only (``entangle_ext.unlearn`` is the function, so
    ``ee.unlearn.X`` fails too): ``filterwarnings(category=ee.OverlappingSplitsWarning)`` raised
    AttributeError. Every warning class of a public module is exported at the top level now."""
    found = {}
    for info in pkgutil.walk_packages(ee.__path__, "entangle_ext."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:   # an optional package (transformers, ...) is missing
            continue
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, Warning) and obj.__module__ == info.name:
                found[name] = obj
    assert len(found) >= 8
    for name, cls in sorted(found.items()):
        assert getattr(ee, name, None) is cls and name in ee.__all__, name
    for name, base in (("WriteError", OSError), ("NonFiniteOutputError", ValueError)):
        assert issubclass(getattr(ee, name), base) and name in ee.__all__


def _texts():
    """(where, text) of every module, public class / function / method docstring and both --help."""
    for info in pkgutil.walk_packages(ee.__path__, "entangle_ext."):
        if info.name.endswith("__main__"):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:   # an optional package (transformers, ...) is missing
            continue
        yield info.name, mod.__doc__ or ""
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) != mod.__name__ or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            yield f"{info.name}.{name}", obj.__doc__ or ""
            for attr, member in vars(obj).items() if inspect.isclass(obj) else ():
                if inspect.isfunction(member) or isinstance(member, property):
                    yield f"{info.name}.{name}.{attr}", member.__doc__ or ""
    yield "entangle-unlearn --help", cli.build_parser().format_help()
    yield "entangle-unlearn compare --help", cli_compare.build_parser().format_help()


def _works(dotted: str, from_: bool, name: str) -> bool:
    """Does the path work as a user would use it? ``from X import Y``: that import; a dotted name:
    ``import`` its longest module prefix, then attribute access from ``entangle_ext``."""
    parts = dotted.split(".")
    if from_:
        return hasattr(importlib.import_module(dotted), name)
    for i in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    obj = ee
    for p in parts[1:]:
        if not hasattr(obj, p):
            return False
        obj = getattr(obj, p)
    return True


def test_every_documented_import_path_works():
    seen, broken = 0, []
    for where, text in _texts():
        for m in REF.finditer(" ".join(text.split())):
            seen += 1
            try:
                ok = _works(m.group(2), bool(m.group(1)), m.group(3))
            except ImportError:
                ok = False
            if not ok:
                broken.append(f"{where}: {m.group(0)}")
    assert seen > 30 and not broken, "\n".join(broken)


def test_the_two_paths_the_help_used_to_give():
    from entangle_ext.compare import available_methods
    from entangle_ext.unlearn import NonFiniteLossError
    assert available_methods() == ee.available_methods() and NonFiniteLossError is ee.NonFiniteLossError
    help_text = " ".join(cli_compare.build_parser().format_help().split())
    assert "entangle_ext.compare.available_methods" not in help_text
    assert all(name in help_text for name in ee.available_methods())       # listed inline


def test_top_level_help_names_the_compare_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "subcommands:" in out and "compare" in out and "compare --help" in out


def test_unlearn_docstring_says_the_default_is_the_cifar100_preset():
    head = "\n\n".join(ee.unlearn.__doc__.split("\n\n")[:2])        # the summary and the next paragraph
    assert "UnlearnConfig()" in head and "CIFAR-100 preset" in head and "setting=" in head
    assert ee.UnlearnConfig() == ee.UnlearnConfig.preset("cifar100")   # what it says is true
