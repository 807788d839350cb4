"""A missing optional package is an ImportError that names what needs it and the extra that
installs it (torchvision for the cifar100 / tinyimagenet / celeba / toxigen-reduced models,
scikit-learn for the metrics)."""
import sys

import pytest

from entangle_ext._optional import optional_import


def _block(monkeypatch, top):
    """Make ``import top`` (and its submodules) fail, even when already imported."""
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, top, None)


@pytest.mark.parametrize("build,extra", [
    ("entangle_ext.data.cifar100:small_resnet_cifar", "vision"),
    ("entangle_ext.data.cifar100:resnet18_cifar", "vision"),
    ("entangle_ext.data.vit:vit_classifier", "vision"),
])
def test_models_without_torchvision_say_how_to_install_it(monkeypatch, build, extra):
    import importlib
    mod, fn = build.split(":")
    builder = getattr(importlib.import_module(mod), fn)
    _block(monkeypatch, "torchvision")
    with pytest.raises(ImportError, match=rf"needs torchvision, an optional dependency of entangle_ext: "
                                          rf"pip install --no-build-isolation '\.\[{extra}\]'"):
        builder(3)


def test_the_package_name_differs_from_the_module_name(monkeypatch):
    _block(monkeypatch, "sklearn")
    with pytest.raises(ImportError, match=r"MIA needs scikit-learn, .*'\.\[metrics\]'.*pip install scikit-learn"):
        optional_import("sklearn.svm", "MIA", "metrics")


@pytest.mark.parametrize("body, says", [
    ("raise ImportError('libfoo.so: failed to map segment from shared object')", "failed to map segment"),
    ("import entangle_missing_dependency_xyz", "No module named 'entangle_missing_dependency_xyz'"),
])
def test_an_installed_package_that_fails_to_import_is_not_called_missing(tmp_path, monkeypatch, body, says):
    """scipy failing to map its shared library (after torch.set_num_threads(100000)) was reported
    as "needs scikit-learn ... pip install scikit-learn" although it was installed."""
    (tmp_path / "entangle_broken_pkg").mkdir()
    (tmp_path / "entangle_broken_pkg" / "__init__.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match=r"the thing needs entangle_broken_pkg, which is installed but failed to "
                                          rf"import: .*{says}") as ei:
        optional_import("entangle_broken_pkg", "the thing", "demo")
    assert "pip install" not in str(ei.value)
    with pytest.raises(ImportError, match="an optional dependency of entangle_ext: pip install"):
        optional_import("entangle_absent_pkg_xyz.sub", "the thing", "demo")
