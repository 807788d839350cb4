"""The example scripts (python_examples/): bad input gives one error line and exit code 2, like the
package CLI, and the CIFAR-100 example never starts the full (GPU) recipe on a CPU by default."""
import importlib.util
import zipfile

import numpy as np
import pytest
from _support import REPO_ROOT

EXAMPLES = REPO_ROOT / "python_examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["cifar100_resnet18", "tinyimagenet_vit", "celeba_vit", "toxigen_transformer"])
@pytest.mark.parametrize("exc", [ValueError("bad variant"), ImportError("No module named 'PIL'"),
                                 FileNotFoundError("no data"), zipfile.BadZipFile("File is not a zip file")])
def test_bad_input_is_one_line_and_exit_code_2(name, exc, monkeypatch, capsys, tmp_path):
    ex = load_example(name)

    def fail(*a, **k):
        raise exc
    monkeypatch.setattr(ex, "prepare", fail)
    with pytest.raises(SystemExit) as info:
        ex.main(["--device", "cpu", "--out", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"{name}: error: {exc}\n"


@pytest.mark.parametrize("argv, expect", [([], "cpu"), (["--variant", "full"], "full"),
                                          (["--variant", "reduced"], "reduced")])
def test_cifar100_example_defaults_to_the_cpu_preset_on_a_cpu(argv, expect, monkeypatch, tmp_path):
    ex = load_example("cifar100_resnet18")
    seen = []

    def record(setting, variant, **k):
        seen.append((setting, variant))
        raise ValueError("stop")
    monkeypatch.setattr(ex, "prepare", record)
    with pytest.raises(SystemExit):
        ex.main(argv + ["--device", "cpu", "--out", str(tmp_path)])
    assert seen == [("cifar100", expect)]


@pytest.mark.parametrize("per_class", [0, -1, 4, 600])
def test_similarity_example_checks_per_class(per_class, monkeypatch, capsys):
    ex = load_example("similarity_split_cifar100")
    fine = np.repeat(np.arange(100), 3)   # 3 train images per fine class
    fake = {"y_train_fine": fine, "y_train_coarse": fine // 5, "x_train": np.zeros((300, 32, 32, 3), np.uint8),
            "fine_names": ["aquarium_fish"] + [f"c{i}" for i in range(1, 100)], "x_test": np.zeros((256, 32, 32, 3))}
    monkeypatch.setattr(ex, "load_cifar100", lambda root=None: fake)
    with pytest.raises(SystemExit) as info:
        ex.main(["--per-class", str(per_class), "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (f"similarity_split_cifar100: error: --per-class must be 1..3 "
                                       f"(train images per fine class), got {per_class}\n")


@pytest.mark.parametrize("n_fine, n_test", [(6, 300), (100, 255)])
def test_similarity_example_needs_the_whole_cifar100(n_fine, n_test, monkeypatch, capsys):
    """A reduced archive failed inside torch.pca_lowrank (q=256 > test images) or with "'aquarium_fish'
    is not in list"; now one line naming what the example needs."""
    ex = load_example("similarity_split_cifar100")
    fine = np.repeat(np.arange(n_fine), 3)
    fake = {"y_train_fine": fine, "y_train_coarse": fine // 5, "x_train": np.zeros((len(fine), 32, 32, 3), np.uint8),
            "fine_names": ["aquarium_fish"] + [f"c{i}" for i in range(1, n_fine)],
            "x_test": np.zeros((n_test, 32, 32, 3), np.uint8)}
    monkeypatch.setattr(ex, "load_cifar100", lambda root=None: fake)
    with pytest.raises(SystemExit) as info:
        ex.main(["--per-class", "2", "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "similarity_split_cifar100: error: this example needs the whole CIFAR-100 (100 fine classes with "
        "aquarium_fish, and at least 256 test images for the PCA-256 baseline); the data found has "
        f"{n_fine} fine classes and {n_test} test images\n")


@pytest.mark.parametrize("name", ["cifar100_resnet18", "tinyimagenet_vit", "celeba_vit", "toxigen_transformer",
                                  "similarity_split_cifar100"])
@pytest.mark.parametrize("device, says", [("bogus", "'bogus' is not a device; use cpu, cuda, cuda:N or mps"),
                                          ("cuda:99", "'cuda:99': "), ("tpu", "'tpu' is not a device")])
def test_a_bad_device_is_an_argparse_error_before_any_data(name, device, says, monkeypatch, capsys):
    # was a RuntimeError traceback from torch.device (or from the first .to(device)) after loading data
    ex = load_example(name)
    for attr in ("prepare", "load_cifar100"):
        if hasattr(ex, attr):
            monkeypatch.setattr(ex, attr, lambda *a, **k: pytest.fail("data loaded before --device was checked"))
    with pytest.raises(SystemExit) as info:
        ex.main(["--device", device])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"{name}: error: argument --device: " + says)   # one program name (was "x.py")


def test_device_arg_normalises_and_refuses():
    import argparse

    from entangle_ext.cli import default_device, device_arg
    assert device_arg("cpu") == "cpu"
    assert device_arg("cpu:0") == "cpu:0"
    assert default_device() in ("cpu", "cuda")
    with pytest.raises(argparse.ArgumentTypeError, match="'meta': unsupported device type 'meta'"):
        device_arg("meta")


def test_dropin_example_takes_no_flags(capsys):
    # it ignored every argument; now argparse answers --help and refuses an unknown flag
    ex = load_example("dropin_ops")
    with pytest.raises(SystemExit) as info:
        ex.main(["--epochs", "3"])
    assert info.value.code == 2
    assert "dropin_ops: error: unrecognized arguments: --epochs 3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        ex.main(["--help"])
    assert info.value.code == 0 and "usage: dropin_ops" in capsys.readouterr().out
