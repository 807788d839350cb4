"""A run as a whole: the global state and model modes it leaves behind, resume that keeps the
whole run and refuses a different one (the two-stage family and the baselines: bit-identical
resumes, other splits / config / method refused), interrupts (SIGTERM / Ctrl-C / KeyboardInterrupt)
that lose nothing, messages that say why no checkpoint exists, and a warning before an out dir is
reused. Checkpoints of earlier versions: test_run_resume_fixtures.py."""
import dataclasses
import json
import os
import signal
import warnings

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.unlearn import RunInterrupted, load_checkpoint

from _support import REPO_ROOT, hup_default
from _tiny import NaNAfter, mlp, params, tiny_config

ALL_SPLITS = ("forget", "adjacent", "remote", "forget_test", "adjacent_test", "remote_test")

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]


class Net(torch.nn.Module):
    """mlp() that calls ``hook(k)`` at its k-th gradient-enabled forward (k = 1, 2, ...): Stage 1
    of tiny_config has one per step (7 steps), Stage 2 three (adjacent, forget, remote)."""

    def __init__(self, hook=None, seed=0):
        super().__init__()
        self.net, self.hook, self.calls = mlp(seed), hook, 0

    def forward(self, x):
        if torch.is_grad_enabled() and self.hook is not None:
            self.calls += 1
            self.hook(self.calls)
        return self.net(x)


# ----------------------------------------------------------------------------- global state
def _global_state():
    cudnn = torch.backends.cudnn
    return (torch.are_deterministic_algorithms_enabled(), cudnn.deterministic, cudnn.benchmark,
            torch.get_num_threads(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))


def test_global_state_is_restored_after_a_run_and_after_an_error(small, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = _global_state()

    def change_threads(k):
        if k == 16:    # the last gradient forward of the run: Stage-2 step 2, remote pass
            torch.set_num_threads(2)
    ee.unlearn(Net(change_threads), small, tiny_config(deterministic=True), progress=False)
    assert _global_state() == before

    def fail(k):
        if k == 3:
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        ee.unlearn(Net(fail), small, tiny_config(deterministic=True), progress=False)
    assert _global_state() == before


def test_callers_deterministic_setting_survives_a_run(small, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    torch.use_deterministic_algorithms(True)
    try:
        ee.unlearn(mlp(), small, tiny_config(deterministic=False), progress=False)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_the_callers_training_flags_are_restored_after_a_run_and_an_error(small, method):
    """The run puts the model in eval mode (a baseline may train); each submodule's flag is set back."""
    cfg = tiny_config() if method == "two_stage" else None

    def fail(k):
        if k == 3:
            raise RuntimeError("boom")
    for hook in (None, fail):
        model = Net(hook)                  # train mode, but one submodule in eval mode
        model.net[1].eval()
        flags = [m.training for m in model.modules()]
        try:
            res = ee.unlearn(model, small, cfg, method=method, setting="digits", progress=False)
            assert res.model is model
        except RuntimeError as e:
            assert hook is fail and "boom" in str(e)
        assert [m.training for m in model.modules()] == flags == [True, True, True, False, True]
    model = mlp().eval()
    assert not ee.unlearn(model, small, cfg, method=method, setting="digits", progress=False).model.training
    copy = ee.unlearn(mlp(), small, cfg, method=method, setting="digits", inplace=False, progress=False).model
    assert copy.training                   # the copy keeps the flags of the model it was made from


# ------------------------------------------------------------------------- reused out dir
def _reused(record):
    return [w for w in record if issubclass(w.category, ee.OutDirReusedWarning)]


def test_reusing_an_out_dir_warns_and_resuming_does_not(small, tmp_path):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path, progress=False)          # empty dir
        assert not _reused(record)
        ee.unlearn(mlp(), small, tiny_config(), resume=tmp_path, out_dir=tmp_path, progress=False)
        assert not _reused(record)
        ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path, progress=False)          # rerun
    (w,) = _reused(record)
    msg = str(w.message)
    assert f"{tmp_path} already holds a finished run; this run replaces it: its report.json, history.json, " \
           "forget_loss_hist.png, checkpoints/ are removed now" in msg and f"resume={str(tmp_path)!r}" in msg
    assert f"--resume {tmp_path}" in msg and "\n" not in msg and w.filename == __file__   # points at the call
    (tmp_path / "report.json").unlink()
    with pytest.warns(ee.OutDirReusedWarning, match="already holds an unfinished run") as rec:
        ee.unlearn(mlp(), small, method="ga", setting="digits", out_dir=tmp_path, progress=False)
    assert [w.filename for w in _reused(rec)] == [__file__]


def test_a_rerun_removes_the_old_runs_files_and_keeps_the_users(small, tmp_path):
    """A rerun into a used out dir overwrote only the files it wrote itself: the old run's
    selected_model.pt, curves.png, later checkpoints (and report.json, until the new run finished)
    stayed beside the new run's files, read as its own. Now they go once the checks pass; other
    files stay."""
    ck = tmp_path / "checkpoints"
    (ck / "stage2_step000099.dcp").mkdir(parents=True)
    old = ["report.json", "history.json", "forget_loss_hist.png", "curves.png", "selected_model.pt",
           "checkpoints/stage2_step000099.pt", "checkpoints/latest.pt", "checkpoints/stage1_done.pt.7.tmp",
           "checkpoints/stage2_step000099.dcp/0.distcp"]
    for name in old + ["mine.txt", "checkpoints/notes.txt"]:
        (tmp_path / name).write_text("old")
    with pytest.raises(TypeError):     # refused (a dict config): nothing is removed
        ee.unlearn(mlp(), small, {"stage1": {"lr": 0.1}}, out_dir=tmp_path, progress=False)
    assert all((tmp_path / n).read_text() == "old" for n in old)
    with pytest.warns(ee.OutDirReusedWarning, match="curves.png, selected_model.pt, checkpoints/ are removed now"):
        ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path, progress=False)
    assert not any((tmp_path / n).exists() for n in ["curves.png", "selected_model.pt",
                                                     "checkpoints/stage2_step000099.pt",
                                                     "checkpoints/stage2_step000099.dcp",
                                                     "checkpoints/stage1_done.pt.7.tmp"])
    assert (tmp_path / "mine.txt").read_text() == (ck / "notes.txt").read_text() == "old"
    assert json.loads((tmp_path / "report.json").read_text())["steps"] == {"stage1": 7, "stage2": 3}   # the new run's
    assert sorted(p.name for p in ck.iterdir()) == ["latest.pt", "notes.txt", "stage1_done.pt", "stage2_done.pt"]


def test_a_rerun_keeps_the_users_own_pt_files_in_checkpoints(small, tmp_path):
    """An out dir whose checkpoints/ holds the user's own training checkpoints (a project folder):
    the removal took every ``checkpoints/*.pt``, deleting them; only the names a run writes go."""
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    mine = ["resnet18_epoch90.pt", "pretrained.pt", "best.pt.bak", "notes.tmp"]
    old = ["stage1_step000004.pt", "stage2_done.pt", "done.pt", "salun_step1234567.pt", "latest.pt.99.tmp"]
    for name in mine + old:
        (ck / name).write_text("x")
    with pytest.warns(ee.OutDirReusedWarning):
        ee.unlearn(mlp(), small, tiny_config(run_stage2=False), out_dir=tmp_path, progress=False)
    assert all((ck / n).read_text() == "x" for n in mine)
    assert not any((ck / n).exists() for n in old)


def test_a_checkpoints_dir_of_the_users_own_files_is_no_run_to_warn_about(small, tmp_path):
    """checkpoints/ holding only the user's files: no warning ("its checkpoints/ are removed now"
    said it although nothing of it was removed); a run's checkpoint beside them is named."""
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    (ck / "pretrained.pt").write_text("x")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ee.unlearn(mlp(), small, tiny_config(run_stage2=False), out_dir=tmp_path, progress=False)
    assert not _reused(record) and (ck / "pretrained.pt").read_text() == "x"
    (tmp_path / "report.json").unlink()
    with pytest.warns(ee.OutDirReusedWarning, match=r"an unfinished run; this run replaces it: its history.json, "
                      r"forget_loss_hist.png, checkpoints/ are removed now"):
        ee.unlearn(mlp(), small, tiny_config(run_stage2=False), out_dir=tmp_path, progress=False)
    assert (ck / "pretrained.pt").read_text() == "x"


def test_a_rerun_removes_only_files_and_does_not_follow_a_linked_checkpoints_dir(small, tmp_path):
    """Only what a run writes goes: a directory under a run file's name stays, and a checkpoints/
    that is a symlink is not followed (its target's *.pt files were deleted)."""
    out, elsewhere = tmp_path / "out", tmp_path / "kept"
    (out / "curves.png").mkdir(parents=True)            # not a file: left alone
    (out / "report.json").write_text("{}")
    elsewhere.mkdir()
    (elsewhere / "mine.pt").write_text("keep")
    (out / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(ee.OutDirReusedWarning):
        ee.unlearn(mlp(), small, tiny_config(run_stage2=False), out_dir=out, progress=False)
    assert (out / "curves.png").is_dir() and (elsewhere / "mine.pt").read_text() == "keep"


@pytest.mark.parametrize("method", ["two_stage", "ga"])
def test_a_refused_call_does_not_warn_about_the_out_dir(small, tmp_path, method):
    """Bad input raises before the reused-out-dir warning: the user sees only the error."""
    (tmp_path / "report.json").write_text("{}")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises((ValueError, TypeError)):
            if method == "two_stage":
                ee.unlearn(mlp(), small, {"stage1": {"lr": 0.1}}, out_dir=tmp_path, progress=False)
            else:
                ee.unlearn(mlp(), small, method="ga", setting="no_such_setting", out_dir=tmp_path,
                           progress=False)
        with pytest.raises(ValueError):    # splits without the forget part
            ee.unlearn(mlp(), ee.Splits(adjacent=small.adjacent, remote=small.remote), method=method,
                       setting="digits",
                       out_dir=tmp_path, progress=False)
    assert not _reused(record)
    assert (tmp_path / "report.json").read_text() == "{}"


# -------------------------------------------------------------------------------- resume
@pytest.fixture(scope="module")
def full_run(small, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=2)
    res = ee.unlearn(mlp(), small, cfg, out_dir=out, progress=False)
    return out, res


@pytest.mark.parametrize("name", ["stage1_step000004.pt", "stage1_done.pt", "stage2_step000002.pt"])
def test_resume_reports_the_whole_run(small, full_run, tmp_path, name):
    out, full = full_run
    r = ee.unlearn(mlp(seed=9), small, resume=out / "checkpoints" / name, out_dir=tmp_path,
                   progress=False)
    assert torch.equal(params(r.model), params(full.model))
    rep = r.report
    assert rep["steps"] == full.report["steps"] == {"stage1": 7, "stage2": 3}
    assert rep["lambda_final"] == full.report["lambda_final"] is not None
    assert {"stage1", "stage2", "eval_original", "eval_stage1"} <= set(rep["timings_s"])
    assert rep["timings_s"]["stage1"] > 0
    assert r.history == full.history
    assert json.loads((tmp_path / "history.json").read_text()) == full.history
    assert rep["evals"] == full.report["evals"]
    assert rep["resume"]["from"].endswith(name) and rep["resume"]["config_changes"] == {}


def test_every_checkpoint_carries_the_report_inputs(full_run):
    out, full = full_run
    for name in ("stage1_step000002.pt", "stage1_done.pt", "stage2_step000002.pt", "stage2_done.pt"):
        ck = load_checkpoint(out / "checkpoints" / name)
        assert set(ck["fingerprint"]["splits"]) == {"forget", "adjacent", "remote", "forget_test",
                                                    "adjacent_test", "remote_test"}
        assert ck["fingerprint"]["splits"]["remote"]["n"] == 100
        assert "stage1" in ck["timings"] and "original" in ck["evals"]
        if name.startswith("stage2"):
            assert ck["done"]["lambda_final"] == full.report["lambda_final"]
            done = (1, 2) if name == "stage2_done.pt" else (1,)
            assert ck["done"]["history"] == [h for h in full.history if h["stage"] in done]


@pytest.mark.parametrize("change", ["fewer_samples", "other_labels", "other_samples", "new_split"])
def test_resume_with_other_splits_raises(small, full_run, change):
    out, _ = full_run
    x, y = small.remote.tensors
    s = {"fewer_samples": dataclasses.replace(small, remote=TensorDataset(x[:-1], y[:-1])),
         "other_labels": dataclasses.replace(small, remote=TensorDataset(x, torch.where(
             torch.arange(len(y)) == 5, 1 - y, y))),
         "other_samples": dataclasses.replace(small, remote=TensorDataset(x.flip(0), y)),
         "new_split": dataclasses.replace(small, forget_test=None)}[change]
    name = "forget_test" if change == "new_split" else "remote"
    with pytest.raises(ValueError, match=rf"splits differ.*split '{name}'"):
        ee.unlearn(mlp(), s, resume=out, progress=False)


def test_resume_with_another_config_raises_unless_allowed(small, full_run, tmp_path):
    out, full = full_run
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=2)
    cfg.stage2.lr = 1e-3
    with pytest.raises(ValueError, match=r"stage2\.lr: 0\.002 in the checkpoint vs 0\.001 now"):
        ee.unlearn(mlp(), small, cfg, resume=out / "checkpoints" / "stage2_step000002.pt",
                   progress=False)
    r = ee.unlearn(mlp(), small, cfg, resume=out / "checkpoints" / "stage2_step000002.pt",
                   allow_config_change=True, out_dir=tmp_path, progress=False)
    assert r.report["resume"]["config_changes"] == {"stage2.lr": [0.002, 0.001]}
    assert json.loads((tmp_path / "report.json").read_text())["resume"]["config_changes"] == \
        {"stage2.lr": [0.002, 0.001]}
    assert not torch.equal(params(r.model), params(full.model))
    # logging / checkpoint intervals may change without the flag
    quiet = dataclasses.replace(tiny_config(), checkpoint_every=0, log_every=5)
    r = ee.unlearn(mlp(), small, quiet, resume=out / "checkpoints" / "stage1_done.pt", progress=False)
    assert torch.equal(params(r.model), params(full.model))


def test_resume_under_another_method_is_refused_naming_both(small, full_run, tmp_path):
    """A checkpoint names its method: a two_stage one is not continued as an ablation (which would
    run the checkpoint's config under the ablation's name), a stage1_only one not as two_stage, and
    a baseline's not as a two-stage method (nor the reverse), whatever the config."""
    out, _ = full_run
    assert {load_checkpoint(p)["method"] for p in (out / "checkpoints").glob("stage*.pt")} == {"two_stage"}
    s1 = tmp_path / "s1"
    ee.unlearn(mlp(), small, tiny_config(), method="stage1_only", out_dir=s1, progress=False)
    ft = tmp_path / "ft"
    ee.unlearn(mlp(), small, method="ft", setting="digits", out_dir=ft, progress=False)
    for ckpt, written, method, cfg in [
            (out / "checkpoints" / "stage1_done.pt", "two_stage", "no_w2", None),
            (out, "two_stage", "pgd_mean", tiny_config()),
            (s1, "stage1_only", "two_stage", None),
            (s1, "stage1_only", "two_stage", tiny_config()),
            (ft, "ft", "two_stage", None),
            (out, "two_stage", "ft", None),
            (load_checkpoint(out), "two_stage", "stage1_only", None)]:
        with pytest.raises(ValueError, match=rf"written by method '{written}', not '{method}': resume it with "
                                             rf"method='{written}' \(command line: --method {written}\)"):
            ee.unlearn(mlp(), small, cfg, method=method, resume=ckpt, allow_config_change=True, progress=False)


# ----------------------------------------------------------------------------- interrupts
def _uninterrupted(small):
    return params(ee.unlearn(Net(), small, tiny_config(), progress=False).model)


_SIGNAL_OF = {"sigterm": "SIGTERM", "sigint": "SIGINT", "sighup": "SIGHUP", "raise": None}


def _handlers():
    return tuple(signal.getsignal(getattr(signal, n)) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP here")
def test_a_sighup_ignored_under_nohup_stays_ignored_in_a_stage(small):
    seen = []

    def hook(k):
        if k == 4:
            seen.append(signal.getsignal(signal.SIGHUP))
            os.kill(os.getpid(), signal.SIGHUP)   # ignored: the run goes on
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        r = ee.unlearn(Net(hook), small, tiny_config(), progress=False)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert seen == [signal.SIG_IGN] and r.report["steps"] == {"stage1": 7, "stage2": 3}


@pytest.mark.parametrize("how, call, stage, steps", [
    ("sigterm", 4, 1, 4),        # SIGTERM in step 3: that step completes, then the checkpoint
    ("sighup", 4, 1, 4),         # SIGHUP (a closed terminal) likewise; it was not handled: the process died
    ("sigint", 9, 2, 1),         # Ctrl-C in Stage-2 step 0 (its forget pass)
    ("raise", 4, 1, 3),          # KeyboardInterrupt raised in step 3's forward: steps 0-2 kept
    ("raise", 12, 2, 1),         # ... in Stage-2 step 1's forget forward
])
def test_interrupt_writes_the_last_completed_step_and_resumes_exactly(small, tmp_path, how, call,
                                                                      stage, steps):
    if how == "sighup" and not hasattr(signal, "SIGHUP"):
        pytest.skip("no SIGHUP here")
    sent = _SIGNAL_OF[how]

    def hook(k):
        if k == call:
            if sent is None:
                raise KeyboardInterrupt
            os.kill(os.getpid(), getattr(signal, sent))
    cfg = tiny_config()    # checkpoint_every = 0
    with hup_default(how == "sighup"):
        handlers = _handlers()
        with pytest.raises(RunInterrupted) as ei:
            ee.unlearn(Net(hook), small, cfg, out_dir=tmp_path, progress=False)
        assert _handlers() == handlers
    e = ei.value
    assert isinstance(e, KeyboardInterrupt) and (e.stage, e.step) == (stage, steps)
    assert e.signal == (sent or "KeyboardInterrupt")
    assert e.checkpoint.endswith(f"stage{stage}_step{steps:06d}.pt")
    assert f"resume={str(tmp_path)!r}" in str(e) and "entangle_ext.unlearn(" in str(e)
    r = ee.unlearn(Net(), small, resume=tmp_path, out_dir=tmp_path, progress=False)
    assert torch.equal(params(r.model), _uninterrupted(small))
    assert r.report["steps"] == {"stage1": 7, "stage2": 3}


def test_interrupt_without_out_dir_says_so(small):
    def hook(k):
        if k == 2:
            raise KeyboardInterrupt
    with pytest.raises(RunInterrupted, match="no checkpoint was written"):
        ee.unlearn(Net(hook), small, tiny_config(), progress=False)


def test_interrupt_inside_a_state_update_writes_no_checkpoint(small):
    """A KeyboardInterrupt raised while a step updates the run state (e.g. from the model's code
    in the post-step dual update) would leave a half-done step: no checkpoint, no RunInterrupted."""
    from entangle_ext.unlearn import StageLoop
    from entangle_ext.unlearn.data import BatchStream
    from entangle_ext.unlearn.loop import updating
    saved = []

    def step(i, batch):
        with updating():
            if i == 2:
                raise KeyboardInterrupt
        return torch.tensor(1.0), []
    stream = BatchStream(small.forget, 4, shuffle=False, seed=0, name="t", device="cpu")
    loop = StageLoop("t", "t", [], progress=False, checkpoint_fn=lambda s, st: saved.append(s))
    with pytest.raises(KeyboardInterrupt) as ei:
        loop.run(stream, 1, step, objects={})
    assert not isinstance(ei.value, RunInterrupted) and saved == []
    assert "without a checkpoint" in str(ei.value)


# ------------------------------------------------------- why there is no checkpoint to go back to
@pytest.mark.parametrize("out, every, says", [
    (True, 0, "no stage had finished and checkpoint_every is 0; set checkpoint_every (--checkpoint-every)"),
    (True, 5, "the first was due after step 5 (checkpoint_every)"),
    (False, 0, "pass out_dir (--out) to keep checkpoints")])
def test_non_finite_loss_without_a_checkpoint_says_why(small, tmp_path, out, every, says):
    with pytest.raises(ee.NonFiniteLossError) as ei:
        ee.unlearn(NaNAfter(1), small, tiny_config(checkpoint_every=every), out_dir=tmp_path if out else None,
                   progress=False)
    e = ei.value
    assert (e.stage, e.step, e.checkpoint) == (1, 1, None) and says in str(e)
    assert ("pass out_dir" in str(e)) == (not out)


def test_non_finite_loss_after_a_resume_names_the_checkpoint_resumed_from(small, full_run, tmp_path):
    out, _ = full_run
    start = out / "checkpoints" / "stage1_done.pt"
    model = mlp()                                          # NaN logits from Stage 2's first step on
    model.register_forward_hook(lambda m, args, out: out * float("nan") if torch.is_grad_enabled() else out)
    with pytest.raises(ee.NonFiniteLossError) as ei:
        ee.unlearn(model, small, resume=start, out_dir=tmp_path, progress=False)
    assert (ei.value.stage, ei.value.step) == (2, 0) and ei.value.checkpoint == str(start)
    assert f"last good checkpoint: {start}" in str(ei.value)


def test_interrupt_without_a_checkpoint_says_why(small):
    def hook(k):
        if k == 2:
            raise KeyboardInterrupt
    with pytest.raises(ee.RunInterrupted, match=r"no checkpoint was written: pass out_dir \(--out\)"):
        ee.unlearn(Net(hook), small, tiny_config(checkpoint_every=0), progress=False)


def test_reused_out_dir_warning_from_a_python_dash_m_main(tmp_path):
    """The warning is attributed to the caller's line; for a `python -m` module (its frame is
    __main__) that must not make the warning machinery fail (it asked the loader for __main__'s
    source: ImportError). A `python -m` script that runs twice into one out dir warns and succeeds.
    (The demo itself rewrites its own out dir without a warning.)"""
    pytest.importorskip("sklearn")
    import subprocess
    import sys
    import textwrap
    (tmp_path / "rerun_twice.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT / 'tests')!r})
        import entangle_ext as ee
        from entangle_ext.data.digits import digits_splits
        from _tiny import mlp, tiny_config
        splits = digits_splits(max_train_per_digit=20)[0]
        for _ in range(2):
            ee.unlearn(mlp(), splits, tiny_config(), out_dir={str(tmp_path / "out")!r}, progress=False)
        print("done")
    """))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    again = subprocess.run([sys.executable, "-m", "rerun_twice"], capture_output=True, text=True, env=env,
                           timeout=300, cwd=tmp_path)
    assert again.returncode == 0 and "done" in again.stdout, again.stderr[-2000:]
    assert "OutDirReusedWarning" in again.stderr and "already holds a finished run" in again.stderr


# ---------------------------------------------------------------- the two-stage family
def test_full_run_checkpoint_and_resume(small, tmp_path):
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=2)
    res = ee.unlearn(mlp(), small, cfg, out_dir=tmp_path / "a", progress=False)
    rep = json.loads((tmp_path / "a" / "report.json").read_text())
    assert set(rep["evals"]) == {"original", "stage1", "stage2", "final"}
    assert set(rep["evals"]["stage2"]) == {"forget", "adjacent", "remote", "forget_test",
                                           "adjacent_test", "remote_test"}
    assert (tmp_path / "a" / "forget_loss_hist.png").stat().st_size > 1000
    assert rep["steps"] == {"stage1": 7, "stage2": 3}
    assert [h["step"] for h in res.history if h["stage"] == 1] == list(range(7))
    assert "original" in res.table and "stage2" in res.table
    ck = tmp_path / "a" / "checkpoints"
    for name in ("stage1_step000004.pt", "stage1_done.pt", "stage2_step000002.pt", "stage2_done.pt"):
        assert (ck / name).exists(), name
    final = params(res.model)
    for name in ("stage1_step000004.pt", "stage1_done.pt", "stage2_step000002.pt"):
        r = ee.unlearn(mlp(seed=9), small, resume=ck / name, out_dir=tmp_path / name, progress=False)
        torch.testing.assert_close(params(r.model), final, rtol=0, atol=0, msg=name)
    r = ee.unlearn(mlp(seed=9), small, resume=tmp_path / "a", progress=False)   # latest = stage2_done
    torch.testing.assert_close(params(r.model), final, rtol=0, atol=0)


# ------------------------------------------------------------- the baselines' checkpoints and resume
@pytest.mark.parametrize("name, over", [("salun", dict(epochs=2, batch_size=32, momentum=0.9)),
                                        ("scrub", dict(epochs=2, msteps=2, batch_size=32)),
                                        ("gdr", dict(epochs=3, batch_size=32, forget_batch_size=8)),
                                        ("rl", dict(epochs=2, batch_size=32)),
                                        ("neggrad_plus", dict(epochs=2, batch_size=32))])
def test_baseline_checkpoint_and_resume_bit_identical(small, tmp_path, name, over):
    cfg = get_method(name).config_for("digits", checkpoint_every=3, log_every=2, **over)
    full = ee.unlearn(mlp(), small, cfg, method=name, out_dir=tmp_path / "a", progress=False)
    ck = sorted((tmp_path / "a" / "checkpoints").glob(f"{name}_step*.pt"))
    assert ck, "no mid-run checkpoint written"
    mid = ck[len(ck) // 2]
    assert load_checkpoint(mid)["method"] == name
    r = ee.unlearn(mlp(seed=9), small, method=name, resume=mid, progress=False)   # config from the checkpoint
    torch.testing.assert_close(params(r.model), params(full.model), rtol=0, atol=0)
    assert [h["step"] for h in r.history] == [h["step"] for h in full.history]
    done = ee.unlearn(mlp(seed=9), small, method=name, resume=tmp_path / "a", progress=False)
    torch.testing.assert_close(params(done.model), params(full.model), rtol=0, atol=0)
    with pytest.raises(ValueError, match="written by method"):
        ee.unlearn(mlp(), small, method="ft", resume=mid, progress=False)


@pytest.fixture(scope="module")
def ft_run(small, tmp_path_factory):
    """An ft run on ``small`` with mid-run checkpoints (12 steps, one every 2): (out dir, result)."""
    out = tmp_path_factory.mktemp("ft")
    cfg = get_method("ft").config_for("digits", checkpoint_every=2, epochs=2, batch_size=32)
    return out, ee.unlearn(mlp(), small, cfg, method="ft", out_dir=out, progress=False)


def test_baseline_resume_refuses_other_splits(small, ft_run):
    """A baseline's checkpoint holds the splits fingerprint; a resume on other data is refused (as
    for the two-stage family), whatever the config."""
    out, full = ft_run
    assert load_checkpoint(out)["fingerprint"] == full.report["fingerprint"]
    assert set(full.report["fingerprint"]["splits"]) == set(ALL_SPLITS) and full.report["resume"] is None
    x, y = small.forget.tensors
    other = dataclasses.replace(small, forget=TensorDataset(x[:10], y[:10]))
    for cfg in (None, full.report["config"]):
        cfg = cfg and get_method("ft").Config.from_dict(cfg)
        with pytest.raises(ValueError, match=r"resume: the splits differ.*split 'forget': 20 samples in the "
                                             r"checkpoint vs 10 samples now"):
            ee.unlearn(mlp(), other, cfg, method="ft", resume=out, allow_config_change=True, progress=False)


def test_baseline_resume_refuses_another_config_unless_allowed(small, ft_run):
    out, full = ft_run
    mid = out / "checkpoints" / "ft_step000006.pt"
    cfg = get_method("ft").Config.from_dict(full.report["config"]).replace(weight_decay=0.5)
    with pytest.raises(ValueError, match=r"config differs.*weight_decay: 0\.0 in the checkpoint vs 0\.5 now.*"
                                         r"allow_config_change=True \(command line: --allow-config-change\)"):
        ee.unlearn(mlp(), small, cfg, method="ft", resume=mid, progress=False)
    same = ee.unlearn(mlp(seed=9), small, method="ft", resume=mid, progress=False)
    assert same.report["resume"] == {"from": str(mid), "config_changes": {}}
    torch.testing.assert_close(params(same.model), params(full.model), rtol=0, atol=0)
    from entangle_ext.unlearn.checkpoint import Checkpointer   # an interrupted run's hint names the method
    assert f"unlearn(model, splits, method='ft', resume={str(out)!r}" in Checkpointer(out, {"method": "ft"}).resume_hint
    changed = ee.unlearn(mlp(seed=9), small, cfg, method="ft", resume=mid, allow_config_change=True, progress=False)
    assert changed.report["resume"]["config_changes"] == {"weight_decay": [0.0, 0.5]}
    assert changed.report["config"]["weight_decay"] == 0.5
    # the new weight decay is applied from the resume point on (not the optimizer's saved one)
    assert not torch.equal(params(changed.model), params(full.model))


def _other_head(seed=5):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_resume_into_another_architecture_is_refused_and_leaves_the_model_untouched(small, full_run, ft_run,
                                                                                    method):
    """A checkpoint whose model does not fit the caller's (another head, another layer) is refused
    with a ValueError naming the mismatching parameters, before anything is loaded into it."""
    out = (full_run if method == "two_stage" else ft_run)[0]
    for m, says in [(_other_head(), r"'2\.weight': \(2, 32\) in the checkpoint vs \(3, 32\) in the model"),
                    (torch.nn.Sequential(torch.nn.Linear(64, 2)), r"missing from the model: '2\.bias', '2\.weight'")]:
        before = {k: v.clone() for k, v in m.state_dict().items()}
        with pytest.raises(ValueError, match=r"resume: the checkpoint's model does not fit the model given.*" + says):
            ee.unlearn(m, small, method=method, resume=out, progress=False)
        assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_checkpoint_every_without_out_dir_warns(small, tmp_path):
    """checkpoint_every > 0 with no out_dir was silently ignored: no checkpoint, no word."""
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=2)
    with pytest.warns(UserWarning, match=r"UnlearnConfig.checkpoint_every=2 .* out_dir is None: no checkpoint") as w:
        ee.unlearn(Net(), small, cfg, progress=False)
    assert [x.filename for x in w if "checkpoint_every" in str(x.message)] == [__file__]   # the caller's line
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpoint_every")
        ee.unlearn(Net(), small, cfg, out_dir=tmp_path, progress=False)          # with one: no warning
        ee.unlearn(Net(), small, tiny_config(), progress=False)                  # 0: nothing asked for
