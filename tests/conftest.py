import faulthandler
import os
import signal

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from _support import DEVICES, HAS_CUDA, REPO_ROOT, SHARED_DATA  # noqa: F401  (REPO_ROOT, SHARED_DATA: re-exported)

# Seconds after the per-test alarm at which a test stuck in native code (where a Python signal
# handler cannot run, e.g. a hung kernel) dumps every thread's traceback and ends the process.
_HARD_EXIT_GRACE_S = float(os.environ.get("ENTANGLE_TEST_TIMEOUT_GRACE", 30))


def pytest_addoption(parser):
    parser.addoption(
        "--test-timeout", type=float, default=float(os.environ.get("ENTANGLE_TEST_TIMEOUT", 0)),
        help="fail any test phase (setup, call, teardown) that runs longer than this many seconds "
             "(0: off; default $ENTANGLE_TEST_TIMEOUT). For machines without pytest-timeout; "
             "a test stuck in native code ends the run after a further "
             f"{_HARD_EXIT_GRACE_S:g} s with a traceback dump.")


def pytest_configure(config):
    config.addinivalue_line("markers", "sanitize: small CUDA test run under compute-sanitizer "
                                       "by scripts/gpu_check.sh")


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)


@pytest.fixture(params=[pytest.param(d, marks=pytest.mark.cuda) if d == "cuda" else d
                        for d in DEVICES])
def device(request):
    """Each device of DEVICES; the CUDA instances carry the `cuda` marker (`pytest -m cuda`)."""
    return torch.device(request.param)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """$HOME is tmp_path/home and the working directory tmp_path/cwd (where a literal ``~`` path
    would land); the test fails if anything was written there. Yields the home directory."""
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "cwd")
    yield tmp_path / "home"
    assert list((tmp_path / "cwd").iterdir()) == [], "a path with ~ was written under the working directory"


@pytest.fixture
def one_thread():
    """torch runs on one CPU thread during the test (the count before is restored); use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def small():
    """The digits miniature (needs scikit-learn): forget 20, adjacent 80, remote 100 train samples
    and the held-out parts; float32 inputs, parity labels. One per test module."""
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    return digits_splits(max_train_per_digit=20)[0]


class PhaseTimeout(Exception):
    """A test phase ran past --test-timeout."""


def _alarm_seconds(item):
    limit = item.config.getoption("--test-timeout")
    if not limit or limit <= 0 or not hasattr(signal, "SIGALRM"):
        return 0.0
    if item.config.pluginmanager.hasplugin("timeout") and item.config.getoption("timeout", None):
        return 0.0   # pytest-timeout is active: it owns the alarm
    return float(limit)


def _timed_phase(item, phase):
    limit = _alarm_seconds(item)
    if not limit:
        return None

    def on_alarm(signum, frame):
        raise PhaseTimeout(f"{item.nodeid}: {phase} ran longer than {limit:g} s (--test-timeout)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    # This wrapper runs outside pytest's output capture: a duplicate of the real stderr keeps the
    # dump visible when the process is ended from inside a captured test.
    stderr = os.dup(2)
    faulthandler.dump_traceback_later(limit + _HARD_EXIT_GRACE_S, exit=True, file=stderr)
    return previous, stderr


def _end_phase(state):
    if state is None:
        return
    previous, stderr = state
    signal.setitimer(signal.ITIMER_REAL, 0)
    faulthandler.cancel_dump_traceback_later()
    os.close(stderr)
    signal.signal(signal.SIGALRM, previous)


def _timed_hook(phase):
    """A hook wrapper that runs one test phase under the --test-timeout alarm."""
    @pytest.hookimpl(hookwrapper=True)
    def hook(item):
        state = _timed_phase(item, phase)
        try:
            yield
        finally:
            _end_phase(state)
    return hook


pytest_runtest_setup = _timed_hook("setup")
pytest_runtest_call = _timed_hook("call")
pytest_runtest_teardown = _timed_hook("teardown")
