"""Checkpoints written by an earlier version of the package (tests/fixtures/resume, made at 2c33944,
before the one-run-lifecycle refactor) resume to the uninterrupted run of that version (bit for
bit on the CPU that wrote them, to float32 round-off on others): checkpoint file names and keys
are a compatibility promise (issue 21)."""

import pytest
import torch

import entangle_ext as ee
from _support import REPO_ROOT
from _tiny import mlp, params

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "resume"


@pytest.fixture(scope="module")
def expected():
    return torch.load(FIXTURES / "expected.pt", weights_only=True)


@pytest.mark.parametrize("method", ["two_stage", "no_w2", "ga", "ft"])
def test_a_checkpoint_of_the_earlier_lifecycles_resumes_to_the_uninterrupted_run(small, expected, method):
    r = ee.unlearn(mlp(seed=9), small, method=method, resume=FIXTURES / f"{method}.pt", progress=False)
    # the fixtures were written on one CPU (AMD EPYC family 26 model 2, AVX-512) in float32: another
    # vector ISA moves the last bits, a resume that lost state moves them by far more than this
    torch.testing.assert_close(params(r.model), expected[method]["params"], rtol=1e-4, atol=1e-5)
    assert [h["step"] for h in r.history] == expected[method]["steps"]
    assert r.report["resume"]["from"] is not None
