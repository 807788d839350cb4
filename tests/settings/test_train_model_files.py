"""Reading model files and checkpoints (entangle_ext.train.load_model_file, load_checkpoint,
``--original``, ``--resume``): the package's own checkpoints, the ``latest.pt`` pointer and out
dirs are accepted, read with ``weights_only=True``; unreadable files give one clear line."""
import json

import numpy as np
import pytest
import torch

import entangle_ext as ee
from entangle_ext import cli
from entangle_ext.train import load_model_file
from entangle_ext.unlearn import load_checkpoint
from entangle_ext.unlearn.checkpoint import Checkpointer

needs_ext = pytest.mark.skipif(not ee.available(), reason="extension not loaded")
TINY = ["--max-train-per-class", "10", "--original-epochs", "2", "--no-progress", "--epochs", "1",
        "--stage1-epochs", "1", "--batch-limit", "1"]
PREFIX = "is not a readable torch file (state dict or entangle_ext checkpoint): "


@pytest.fixture(autouse=True)
def _threads_restored():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _argv(out, *extra):
    caps = [c for c in TINY if c not in ("--original-epochs", "2")] if "--original" in extra else TINY
    return ["--setting", "digits", "--out", str(out), "--device", "cpu", *caps, *extra]   # --original: no training flag


def _digits_mlp():
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import SETTING_DTYPE, DigitsMLP
    return DigitsMLP(dtype=SETTING_DTYPE)   # the digits setting's model, as its checkpoints hold it


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """An out dir of a finished two-stage run on digits (stage1_done, stage2_done, latest.pt)."""
    pytest.importorskip("sklearn")
    if not ee.available():
        pytest.skip("extension not loaded")
    out = tmp_path_factory.mktemp("run")
    n = torch.get_num_threads()
    try:
        assert cli.main(_argv(out)) == 0
    finally:
        torch.set_num_threads(n)
    return out


def _equal(model, sd):
    return all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())


@needs_ext
@pytest.mark.parametrize("which, tag", [
    ("checkpoints/stage1_done.pt", "stage1_done"), ("checkpoints/stage2_done.pt", "stage2_done"),
    ("checkpoints/latest.pt", "stage2_done"), (".", "stage2_done"), ("checkpoints", "stage2_done")])
def test_load_model_file_reads_the_packages_own_checkpoints(finished_run, which, tag):
    """An unlearn checkpoint holds numpy arrays (its RNG state): they load with weights_only=True;
    the latest.pt pointer is followed and an out dir means its latest checkpoint."""
    want = load_checkpoint(finished_run / "checkpoints" / f"{tag}.pt")["model"]
    model = load_model_file(_digits_mlp(), finished_run / which)
    assert _equal(model, want)


@needs_ext
def test_original_flag_takes_a_checkpoint_and_an_out_dir(finished_run, tmp_path, capsys):
    first = json.loads((finished_run / "report.json").read_text())["evals"]
    for i, given in enumerate([finished_run / "checkpoints" / "stage1_done.pt", finished_run]):
        out = tmp_path / f"b{i}"
        assert cli.main(_argv(out, "--original", str(given))) == 0, capsys.readouterr().err
        rep = json.loads((out / "report.json").read_text())
        # θ0 of this run is that run's Stage-1 (resp. final) model, on the same data
        assert rep["evals"]["original"] == first["stage1" if i == 0 else "stage2"]
        assert rep["run"]["original_model"] == str(given)
        assert rep["run"]["original_recipe"] is None   # loaded, not trained


@pytest.mark.parametrize("content, reason", [
    (b"garbage\n", "not a torch file"), (b"", "empty or truncated"), (b"PK\x03\x04junk", "zip archive"),
    (b"hello\n", "not a torch file: no zip archive"),   # the reason was torch's KeyError text: "101"
    (None, "not a torch file: no zip archive"),         # a truncated torch.save file: "failed finding central directory"
    ("npz", "a zip archive that torch.save did not write (e.g. a numpy .npz)")])   # was "[enforce fail at ...]"
def test_unreadable_file_is_one_clear_line(tmp_path, content, reason):
    bad = tmp_path / "bad.pt"
    if content == "npz":
        with open(bad, "wb") as f:
            np.savez(f, a=np.zeros(3))
        content = bad.read_bytes()
    if content is None:
        torch.save({"w": torch.ones(1000)}, bad)
        content = bad.read_bytes()[:3000]
    bad.write_bytes(content)
    for load in (lambda: load_model_file(_digits_mlp(), bad), lambda: load_checkpoint(bad)):
        with pytest.raises(ValueError) as ei:
            load()
        msg = str(ei.value)
        assert msg.startswith(f"{bad} {PREFIX}") and reason in msg, msg
        assert "\n" not in msg and "weights_only" not in msg and "Re-running" not in msg and "enforce fail" not in msg


@needs_ext
def test_original_garbage_on_the_command_line(tmp_path, capsys):
    pytest.importorskip("sklearn")
    bad = tmp_path / "bogus.pt"
    bad.write_text("garbage\n")
    assert cli.main(_argv(tmp_path / "out", "--original", str(bad))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"entangle-unlearn: error: {bad} {PREFIX}") and len(err.strip().splitlines()) == 1
    assert "weights_only" not in err and not (tmp_path / "out" / "report.json").exists()


class _Boom:
    """Unpickling this would run code (create a file)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_no_code_from_the_file_runs(tmp_path):
    planted = tmp_path / "planted"
    f = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.ones(2)}, "x": _Boom(str(planted))}, f)
    with pytest.raises(ValueError) as ei:
        load_model_file(torch.nn.Linear(2, 1), f)
    assert PREFIX + "it pickles the Python object io.open" in str(ei.value)
    assert not planted.exists()


def test_pointer_is_followed_after_the_out_dir_moved(tmp_path, monkeypatch):
    """latest.pt stores the path as written (relative to the cwd then): the checkpoint beside the
    pointer is found from any cwd, and after the directory was moved."""
    m = torch.nn.Linear(3, 2)
    monkeypatch.chdir(tmp_path)
    Checkpointer("rel", {"config": {}}).save("stage1_done", {"stage": 1, "model": m.state_dict()})
    (tmp_path / "rel").rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved" / "checkpoints")
    for p in (tmp_path / "moved", tmp_path / "moved" / "checkpoints" / "latest.pt"):
        assert _equal(load_model_file(torch.nn.Linear(3, 2), p), m.state_dict())
    assert load_checkpoint(tmp_path / "moved" / "checkpoints" / "latest.pt")["tag"] == "stage1_done"


def test_missing_and_wrong_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        load_model_file(torch.nn.Linear(3, 2), tmp_path)                 # an empty dir
    (tmp_path / "checkpoints").mkdir()
    torch.save({"path": str(tmp_path / "checkpoints" / "gone.pt")}, tmp_path / "checkpoints" / "latest.pt")
    with pytest.raises(FileNotFoundError, match="gone.pt, which does not exist"):
        load_model_file(torch.nn.Linear(3, 2), tmp_path)
    sd = tmp_path / "sd.pt"
    torch.save(torch.nn.Linear(3, 2).state_dict(), sd)
    with pytest.raises(ValueError, match="not an entangle_ext checkpoint.*--original"):
        load_checkpoint(sd)                                                # a model file given as resume
    torch.save({"model": {}, "sharded": {"names": ["model"], "path": "x.dcp"}, "format": 4}, sd)
    with pytest.raises(ValueError, match="sharded .FSDP. run: its model is in x.dcp"):
        load_model_file(torch.nn.Linear(3, 2), sd)


@pytest.mark.parametrize("content", [b"garbage\n", "truncated"])
def test_unreadable_vit_weights_are_one_clear_line(tmp_path, content):
    """``--weights`` (tinyimagenet / celeba) went through a bare torch.load: a garbage or truncated
    file was an UnpicklingError / RuntimeError traceback, where ``--original`` gives one line."""
    pytest.importorskip("torchvision")
    from entangle_ext.data.vit import vit_classifier
    bad = tmp_path / "w.pt"
    if content == "truncated":
        good = tmp_path / "good.pt"
        torch.save({"a": torch.zeros(1000)}, good)
        bad.write_bytes(good.read_bytes()[:3000])
    else:
        bad.write_bytes(content)
    with pytest.raises(ValueError, match="^" + str(bad) + " " + PREFIX.replace("(", r"\(").replace(")", r"\)")):
        vit_classifier(10, arch="vit_b_32", weights=bad)
    torch.save([1, 2], bad)
    with pytest.raises(ValueError, match=r"holds a list, not a state dict of torchvision vit_b_32"):
        vit_classifier(10, arch="vit_b_32", weights=bad)


def test_a_pointer_whose_checkpoint_is_missing_does_not_lead_to_another_run(tmp_path, monkeypatch):
    """latest.pt stores the path relative to the writer's cwd; in a copy of the out dir without the
    checkpoint it named, the stored path led back to the original run's file, and a resume
    continued that run silently."""
    import shutil
    m = torch.nn.Linear(3, 2)
    monkeypatch.chdir(tmp_path)
    Checkpointer("run", {"config": {}}).save("stage1_done", {"stage": 1, "model": m.state_dict()})
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    (tmp_path / "copy" / "checkpoints" / "stage1_done.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"points to the checkpoint run/checkpoints/stage1_done.pt, which does "
                                                r"not exist beside it"):
        load_checkpoint(tmp_path / "copy")


def test_the_sharded_state_of_a_checkpoint_is_read_beside_its_file(tmp_path, monkeypatch):
    """A sharded (FSDP) checkpoint stores its .dcp directory's path relative to the writer's cwd;
    read from a copied out dir, that path led back to the original run's shards (or to nothing
    from another cwd). The directory is now looked for beside the checkpoint file read, and a
    missing one is named. (The two-rank resume from a moved checkpoint is in test_distributed.)"""
    import shutil
    from entangle_ext.unlearn.sharded import sharded_dir
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "checkpoints" / "s.dcp").mkdir(parents=True)
    torch.save({"sharded": {"names": ["model"], "path": "run/checkpoints/s.dcp"}},
               tmp_path / "run" / "checkpoints" / "s.pt")
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    state = {"sharded": {"names": ["model"], "path": "run/checkpoints/s.dcp"},
             "path": str(tmp_path / "copy" / "checkpoints" / "s.pt")}
    assert sharded_dir(state) == str(tmp_path / "copy" / "checkpoints" / "s.dcp")
    shutil.rmtree(tmp_path / "copy" / "checkpoints" / "s.dcp")
    with pytest.raises(FileNotFoundError, match=r"keeps its sharded state in s.dcp/ beside it, which does not exist"):
        sharded_dir(state)
    del state["path"]   # a state not read from a file: the stored path
    assert sharded_dir(state) == "run/checkpoints/s.dcp"
