"""A leading ``~`` in the path arguments of the Python API is the home directory, as the shell reads
it (`entangle_ext._paths.expand_user`): ``unlearn(out_dir=, resume=)``, `run_method`,
`load_checkpoint`, `load_model_file`, `train_original(cache=)` and `compare(out_dir=)` write and
read there, and never make a folder named ``~`` in the working directory."""
import pytest
import torch

import entangle_ext as ee
from entangle_ext.train import TrainRecipe, load_model_file, train_original
from entangle_ext.unlearn import load_checkpoint

from _tiny import mlp, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_expand_user_keeps_the_kind_and_passes_other_values_through(home):
    from pathlib import Path
    from entangle_ext._paths import expand_user
    assert expand_user("~/o") == str(home / "o")
    assert expand_user(Path("~/o")) == home / "o"
    assert expand_user("runs/o") == "runs/o" and expand_user("") == ""
    ckpt = {"config": {}}
    assert expand_user(None) is None and expand_user(ckpt) is ckpt and expand_user(5) == 5


@pytest.mark.parametrize("as_path", [False, True])
def test_unlearn_out_dir_and_resume_expand_the_home_directory(small, home, as_path):
    from pathlib import Path
    out = Path("~/run") if as_path else "~/run"
    ee.unlearn(mlp(), small, tiny_config(), out_dir=out, progress=False)
    assert (home / "run" / "report.json").is_file() and (home / "run" / "checkpoints").is_dir()
    ckpt = load_checkpoint("~/run")
    assert ckpt["path"].startswith(str(home))
    res = ee.unlearn(mlp(), small, out_dir="~/again", resume="~/run/checkpoints/stage1_done.pt", progress=False)
    assert res.report["resume"]["from"].startswith(str(home / "run"))
    assert (home / "again" / "report.json").is_file()


def test_run_method_out_dir_expands_the_home_directory(small, home):
    from entangle_ext.unlearn.method import get_method
    from entangle_ext.unlearn.run import run_method
    run_method(get_method("two_stage"), mlp(), small, tiny_config(), out_dir="~/rm", progress=False)
    assert (home / "rm" / "report.json").is_file()


def test_model_files_and_the_training_cache_expand_the_home_directory(small, home):
    recipe = TrainRecipe("adam", lr=1e-2, epochs=1, batch_size=64, schedule="constant")
    net = train_original(mlp(), [small.forget, small.adjacent, small.remote], recipe, cache="~/c/m.pt",
                         progress=False)
    assert (home / "c" / "m.pt").is_file()
    other = load_model_file(mlp(seed=1), "~/c/m.pt")
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), other.state_dict().values()))
    with pytest.raises(FileNotFoundError, match=str(home / "none.pt")):
        load_model_file(mlp(), "~/none.pt")


@pytest.mark.filterwarnings("ignore::UserWarning")   # MIA undefined: the stand-in method changes nothing
def test_compare_out_dir_expands_the_home_directory(small, home):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    import importlib
    C = importlib.import_module("entangle_ext.compare")

    def run(model, splits, *, seed, device, progress):
        return ee.UnlearnResult(model=model, report={})
    res = ee.compare(mlp(), small, [C.MethodSpec("same", run, {})], seeds=[0], out_dir="~/cmp", progress=False,
                     relearn=False, mia_max_samples=20)
    assert (home / "cmp" / "comparison.md").is_file() and res.paths["markdown"].startswith(str(home))


def test_make_out_dir_expands_the_home_directory(home):
    """The examples' first check of --out (python_examples/*.py) made ./~/... before prepare and
    unlearn wrote to the home directory."""
    from entangle_ext.unlearn.files import make_out_dir
    assert make_out_dir("~/made", "--out") == home / "made" and (home / "made").is_dir()
