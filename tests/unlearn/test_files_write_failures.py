"""Issue 24 item 3: a failed write (disk full, a file-size limit) stops the run with one error
that names the file, the cause and the free space and says what to do, and leaves no temporary
file; the last complete checkpoint stays the one latest.pt names. For every file the package
writes: checkpoints, report/history JSON, plots, the original-model cache, comparison tables,
split files (`atomic_write`)."""
import json
import subprocess
import sys
import textwrap

import pytest

from entangle_ext.unlearn.files import WriteError, atomic_write
from _support import REPO_ROOT

ROOT = REPO_ROOT


def test_a_checkpoint_write_past_a_file_size_limit_is_one_clear_error(tmp_path):
    pytest.importorskip("sklearn")
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        import entangle_ext as ee
        from entangle_ext.data.digits import digits_splits
        from _tiny import mlp, tiny_config
        splits = digits_splits(max_train_per_digit=20)[0]
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, resource.RLIM_INFINITY))   # a checkpoint is larger
        try:
            ee.unlearn(mlp(), splits, tiny_config(checkpoint_every=2), out_dir={str(tmp_path / 'run')!r}, progress=False)
        except Exception as e:
            print("ERROR", type(e).__name__, "|", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    line = [x for x in r.stdout.splitlines() if x.startswith("ERROR")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    msg = line[0]
    assert "WriteError" in msg and "could not write the checkpoint" in msg, msg
    assert "EFBIG" in msg and "MiB free in" in msg, msg
    assert "no checkpoint of this run is complete yet" in msg or "resume from" in msg, msg
    assert list((tmp_path / "run").rglob("*.tmp")) == []


def test_atomic_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text('{"old": 1}')

    def half_then_fail(tmp):
        tmp.write_text('{"new": ')
        raise OSError(28, "No space left on device")
    with pytest.raises(WriteError, match=r"could not write the report .*report\.json \(ENOSPC: No space left on "
                                         r"device; [0-9.]+ MiB free in .*\); free space and retry") as e:
        atomic_write(target, half_then_fail, what="report", hint="free space and retry")
    assert e.value.errno == 28
    assert json.loads(target.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_torch_zip_writer_errors_are_caught_too(tmp_path):
    def torch_like(tmp):
        tmp.write_bytes(b"PK")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    with pytest.raises(WriteError, match=r"could not write the checkpoint .*\(\[enforce fail at inline_container"):
        atomic_write(tmp_path / "c.pt", torch_like, what="checkpoint")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writer", ["report", "history", "split", "cache"])
def test_every_writer_goes_through_atomic_write(writer, tmp_path, monkeypatch):
    """Each of the package's writers raises WriteError (not a raw OSError) when the disk is full."""
    import importlib
    import torch
    real = atomic_write

    def full(path, write, **kw):
        return real(path, lambda tmp: (_ for _ in ()).throw(OSError(28, "No space left on device")), **kw)
    if writer in ("report", "history"):
        report = importlib.import_module("entangle_ext.unlearn.report")
        monkeypatch.setattr(report, "atomic_write", full)
        with pytest.raises(WriteError, match=f"could not write the {writer}"):
            if writer == "report":
                report.save_report_json(tmp_path, {"a": 1})
            else:
                monkeypatch.setattr(report, "save_report_json", lambda out, rep: None)
                report.write_report(tmp_path, {}, [], {}, bins=4, num_classes=2)
    elif writer == "split":
        splits = importlib.import_module("entangle_ext.splits")
        monkeypatch.setattr(importlib.import_module("entangle_ext.split_files"), "atomic_write", full)
        s = splits.IndexSplit(forget=[0], adjacent=[1], remote=[2])
        with pytest.raises(WriteError, match="could not write the split file"):
            splits.save_split(tmp_path / "s.json", s)
    else:
        train = importlib.import_module("entangle_ext.train")
        monkeypatch.setattr(train, "atomic_write", full)
        from torch.utils.data import TensorDataset
        data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
        # the trained model is not lost to a failed cache write: a warning, and the model is returned
        net = torch.nn.Linear(4, 2)
        before = net.weight.detach().clone()
        with pytest.warns(train.CacheNotWrittenWarning, match="could not write the original-model cache .*"
                                                              "the trained model is returned but not cached"):
            out = train.train_original(net, [data], train.TrainRecipe("adam", epochs=1, batch_size=4),
                                       device="cpu", cache=tmp_path / "m.pt", progress=False)
        assert out is net and not torch.equal(net.weight, before)
        assert list(tmp_path.iterdir()) == []
    assert list(tmp_path.rglob("*.tmp")) == []


def test_the_command_line_reports_a_failed_write_in_one_line_with_exit_1(tmp_path):
    """A file-size limit on a CLI run: the original model's cache is skipped with a warning, then
    the first checkpoint fails: one error line naming it (no traceback), exit 1."""
    pytest.importorskip("sklearn")
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (150 * 1024, resource.RLIM_INFINITY))
    r = subprocess.run([sys.executable, "-m", "entangle_ext", "--setting", "digits", "--original-epochs", "1",
                        "--out", str(tmp_path / "w"), "--no-progress", "--device", "cpu"],
                       capture_output=True, text=True, timeout=300, preexec_fn=limit,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [x for x in r.stderr.splitlines() if x.startswith("entangle-unlearn: error:")]
    assert len(errors) == 1 and "could not write the checkpoint" in errors[0] and "EFBIG" in errors[0], r.stderr
    assert "entangle-unlearn: warning: could not write the original-model cache" in r.stderr   # one line
    assert list((tmp_path / "w").rglob("*.tmp")) == []


@pytest.mark.parametrize("under", ["file", "file/sub"])
def test_save_split_into_a_folder_that_cannot_be_made_is_a_write_error(tmp_path, under):
    """A split file whose folder is (or lies under) a file gave a raw FileExistsError [Errno 17] /
    NotADirectoryError from mkdir; now a WriteError naming the split file and what is in the way."""
    from entangle_ext.splits import IndexSplit, load_split, save_split
    (tmp_path / "file").write_text("not a folder")
    target = tmp_path / under / "s.json"
    with pytest.raises(WriteError, match="could not write the split file") as e:
        save_split(target, IndexSplit(forget=[0], adjacent=[1], remote=[2]))
    msg = str(e.value)
    assert str(target) in msg and f"ENOTDIR: {tmp_path / 'file'} is a file, not a folder" in msg, msg
    assert list(tmp_path.rglob("*.tmp")) == [] and (tmp_path / "file").read_text() == "not a folder"
    ok = tmp_path / "new" / "deeper" / "s.json"      # missing folders are still created
    save_split(ok, IndexSplit(forget=[0], adjacent=[1], remote=[2]))
    assert load_split(ok).forget == [0]


def test_a_file_named_checkpoints_in_the_out_dir_is_named_before_any_training(small, tmp_path):
    """The checkpoints folder's mkdir raised a raw FileExistsError [Errno 17]; now the ValueError of
    the out-dir check, naming the folder, before any training."""
    import entangle_ext as ee
    from _tiny import mlp, tiny_config
    (tmp_path / "checkpoints").write_text("mine")
    with pytest.raises(ValueError, match=r"checkpoints folder '.*checkpoints' exists and is not a directory"):
        ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path, progress=False)
    assert (tmp_path / "checkpoints").read_text() == "mine" and not (tmp_path / "report.json").exists()
