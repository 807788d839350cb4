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
