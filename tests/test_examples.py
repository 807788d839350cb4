"""The example scripts (python_examples/): bad input gives one error line and exit code 2, like the
package CLI, and the CIFAR-100 example never starts the full (GPU) recipe on a CPU by default."""
import importlib.util
import zipfile
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "python_examples"


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
    fake = {"y_train_fine": fine, "y_train_coarse": fine // 5, "x_train": np.zeros((300, 32, 32, 3), np.uint8)}
    monkeypatch.setattr(ex, "load_cifar100", lambda root=None: fake)
    with pytest.raises(SystemExit) as info:
        ex.main(["--per-class", str(per_class), "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (f"similarity_split_cifar100: error: --per-class must be 1..3 "
                                       f"(train images per fine class), got {per_class}\n")
