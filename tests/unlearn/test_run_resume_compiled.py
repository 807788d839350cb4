"""A model given as ``torch.compile(model)`` (an ``OptimizedModule``, whose own state dict prefixes
every key with ``_orig_mod.``): checkpoints, ``selected_model.pt``, model files and the model
fingerprint hold the state of the module underneath, so a run interrupted with the plain model
resumes with the compiled one and the reverse (to the uninterrupted run's weights), and a file of
a compiled run loads into the plain model. Before, such a resume was refused as "another
architecture", naming the ``_orig_mod.`` keys. The eager backend keeps the compiled runs fast."""
import os
import signal

import pytest
import torch

import entangle_ext as ee
from entangle_ext.train import TrainRecipe, load_model_file
from entangle_ext.unlearn import RunInterrupted, load_checkpoint
from entangle_ext.unlearn.fingerprint import model_fingerprint

from _tiny import mlp, params, tiny_config

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

PREFIX = "_orig_mod."


class Net(torch.nn.Module):
    """mlp() that calls ``hook(k)`` at its k-th gradient-enabled forward (as test_run_resume.py's
    Net: Stage 1 of tiny_config has one per step, Stage 2 three), outside the compiled graph."""

    def __init__(self, hook=None, seed=0):
        super().__init__()
        self.net, self.hook, self.calls = mlp(seed), hook, 0

    def forward(self, x):
        self._tick()
        return self.net(x)

    @torch.compiler.disable
    def _tick(self):
        if torch.is_grad_enabled() and self.hook is not None:
            self.calls += 1
            self.hook(self.calls)


def compiled(model):
    return torch.compile(model, backend="eager")


FORMS = {"plain": lambda m: m, "compiled": compiled}


@pytest.fixture(scope="module")
def uninterrupted(small):
    return params(ee.unlearn(Net(), small, tiny_config(), progress=False).model)


def _model_entries(out):
    """{checkpoint file name: its "model" entry's keys} of every checkpoint under ``out``."""
    return {p.name: list(torch.load(p, weights_only=False)["model"]) for p in sorted((out / "checkpoints").glob("*.pt"))
            if p.name != "latest.pt"}


@pytest.mark.parametrize("first, then", [("plain", "compiled"), ("compiled", "plain")])
@pytest.mark.parametrize("call, stage, steps", [(4, 1, 3),     # KeyboardInterrupt in Stage-1 step 3
                                                (12, 2, 1)])   # ... in Stage-2 step 1
def test_a_run_interrupted_in_one_form_resumes_in_the_other(small, tmp_path, uninterrupted, first, then, call,
                                                            stage, steps):
    def hook(k):
        if k == call:
            raise KeyboardInterrupt
    with pytest.raises(RunInterrupted) as ei:
        ee.unlearn(FORMS[first](Net(hook)), small, tiny_config(), out_dir=tmp_path, progress=False)
    assert (ei.value.stage, ei.value.step) == (stage, steps)
    entries = _model_entries(tmp_path)
    assert f"stage{stage}_step{steps:06d}.pt" in entries and (stage == 1 or "stage1_done.pt" in entries)
    for name, keys in entries.items():   # the module's own keys, whichever form wrote them
        assert keys == list(Net().state_dict()) and not any(k.startswith(PREFIX) for k in keys), name
    model = FORMS[then](Net())
    r = ee.unlearn(model, small, resume=tmp_path, out_dir=tmp_path, progress=False)
    assert r.model is model and r.report["steps"] == {"stage1": 7, "stage2": 3}
    torch.testing.assert_close(params(r.model), uninterrupted, rtol=0, atol=0)


def test_a_checkpoint_with_prefixed_keys_still_resumes_into_either_form(small, tmp_path, uninterrupted):
    """A checkpoint written from a compiled model's own state dict (the earlier versions did)."""
    def hook(k):
        if k == 4:
            os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(RunInterrupted):
        ee.unlearn(Net(hook), small, tiny_config(), out_dir=tmp_path, progress=False)
    for form in ("plain", "compiled"):
        ckpt = load_checkpoint(tmp_path)   # anew: a run resumed from a dict updates its optimizer state in place
        ckpt["model"] = {PREFIX + k: v for k, v in ckpt["model"].items()}
        r = ee.unlearn(FORMS[form](Net()), small, resume=ckpt, progress=False)
        torch.testing.assert_close(params(r.model), uninterrupted, rtol=0, atol=0, msg=form)


def test_the_selected_model_of_a_compiled_run_loads_into_the_plain_model(small, tmp_path):
    cfg = tiny_config(eval_every=1, select="first_within", select_forget_acc=1.0, select_delta=1.0)
    r = ee.unlearn(compiled(Net()), small, cfg, out_dir=tmp_path, progress=False)
    path = r.report["selected"]["model_file"]
    assert path is not None and r.report["selected"]["global_step"] == 1
    state = torch.load(path, weights_only=True)
    assert list(state) == list(Net().state_dict())
    plain = load_model_file(Net(seed=3), path)
    assert all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
    torch.testing.assert_close(params(plain), params(r.model), rtol=0, atol=0)   # the kept state is the final one
    again = load_model_file(compiled(Net(seed=3)), path)                        # and into a compiled one
    torch.testing.assert_close(params(again), params(r.model), rtol=0, atol=0)


def test_model_files_load_into_either_form(tmp_path):
    src = Net(seed=1)
    torch.save(compiled(src).state_dict(), tmp_path / "compiled.pt")   # keys "_orig_mod.net.0.weight", ...
    torch.save(src.state_dict(), tmp_path / "plain.pt")
    for name in ("compiled.pt", "plain.pt"):
        for form in ("plain", "compiled"):
            m = load_model_file(FORMS[form](Net(seed=2)), tmp_path / name)
            torch.testing.assert_close(params(m), params(src), rtol=0, atol=0, msg=f"{name} into {form}")


def test_a_compiled_and_a_plain_model_with_the_same_weights_fingerprint_the_same(small):
    plain = Net()
    assert model_fingerprint(compiled(plain), small) == model_fingerprint(plain, small)
    assert model_fingerprint(compiled(Net(seed=1)), small) != model_fingerprint(plain, small)


def test_retrain_loads_a_plain_model_fn_model_into_a_compiled_model(small):
    model = compiled(mlp())
    recipe = TrainRecipe("adam", lr=1e-2, epochs=1, batch_size=64, schedule="constant")
    r = ee.unlearn(model, small, recipe, method="retrain", model_fn=lambda: mlp(1), progress=False)
    assert r.model is model and r.report["steps"]["retrain"] > 0
