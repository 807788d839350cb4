"""Fast tests of `entangle_ext.unlearn` with the two-stage method: API, presets, input errors, NaN handling, checkpoint/resume,
the digits miniature, dict (Hugging Face style) batches, CIFAR-100 loading."""
import copy
import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.unlearn import NonFiniteLossError, StageLoop, load_checkpoint
from entangle_ext.unlearn.data import BatchStream

from _support import REPO_ROOT, SHARED_DATA
from _tiny import DictDS, NaNAfter, mlp, params, tiny_config

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]


# ------------------------------------------------------------------------------------------ API
def test_public_api():
    for name in ("unlearn", "Splits", "UnlearnConfig", "Stage1Config", "Stage2Config", "UnlearnResult",
                 "stage1", "stage2", "evaluate"):
        assert hasattr(ee, name), name
        assert getattr(ee, name).__doc__


@pytest.mark.parametrize("cls", [ee.Stage1Config, ee.Stage2Config, ee.UnlearnConfig])
def test_docs_table_lists_every_config_field(cls):
    """docs/algorithm.md has one table per config class (§2, §3) whose rows name every field."""
    doc = (REPO_ROOT / "docs" / "algorithm.md").read_text()
    head = f"`{cls.__name__}` fields"
    assert doc.count(head) == 1, head
    rows = doc[doc.index(head):].split("\n\n")[1]          # the table after the heading line
    documented = {name for line in rows.splitlines() if line.startswith("| `")
                  for name in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert documented == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("name", ["cifar100", "tinyimagenet", "celeba", "toxigen", "digits"])
def test_presets_roundtrip(name):
    cfg = ee.UnlearnConfig.preset(name)
    assert cfg.recipe == "reference"
    assert ee.UnlearnConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_preset_values_and_recipes():
    c = ee.UnlearnConfig.preset("cifar100")
    assert (c.stage1.lr, c.stage1.remote_batch_size, c.stage1.forget_batch_size, c.stage1.clip,
            c.stage1.mu, c.stage1.epochs) == (2.5e-6, 128, 16, 10.0, 10.0, 1)
    s2 = c.stage2
    assert (s2.alpha, s2.lr, s2.momentum, s2.epochs, s2.adjacent_batch_size, s2.forget_batch_size,
            s2.forget_batch_limit, s2.remote_batch_size, s2.remote_batch_limit) == \
        (0.5, 2e-5, 0.9, 6, 128, 128, 10, 512, 10)
    t = ee.UnlearnConfig.preset("toxigen")
    assert t.stage1.clip == 5.0 and t.stage1.confidence_penalty and t.stage2.alpha == 0.8 \
        and t.stage2.momentum == 0.7
    assert ee.UnlearnConfig.preset("tinyimagenet").stage1.lr == 5e-5
    ref, pap = ee.UnlearnConfig.preset("celeba"), ee.UnlearnConfig.preset("celeba", recipe="paper")
    assert (ref.stage2.w2_scope, ref.stage2.forget_mean_sign, ref.stage2.use_momentum, ref.stage1.dual_update) \
        == ("minibatch", -1, True, "pre")
    assert (pap.stage2.w2_scope, pap.stage2.forget_mean_sign, pap.stage2.use_momentum, pap.stage1.dual_update) \
        == ("forget_set", 1, False, "post")
    # the reference loops (docs/algorithm.md §7): cycled forget order, 1e-8 Gram ridge per tensor,
    # ToxiGen penalty on the unclipped CE; the paper recipe keeps the alternatives
    assert (ref.stage1.forget_order, ref.stage2.gram_ridge, ref.stage1.penalty_on) == ("cycle", 1e-8, "ce")
    assert (pap.stage1.forget_order, pap.stage2.gram_ridge, pap.stage1.penalty_on) == \
        ("reshuffle", None, "clipped")
    assert ee.UnlearnConfig.preset("toxigen").stage1.penalty_factor == 1.0
    with pytest.raises(ValueError):
        ee.UnlearnConfig.preset("mnist")
    with pytest.raises(ValueError):
        ee.UnlearnConfig.preset("digits", recipe="blog")
    with pytest.raises(ValueError):
        ee.Stage2Config(alpha=1.5)


@pytest.mark.parametrize("stage, name, value", [("stage2", "w2_scope", "everything"),
                                                ("stage1", "dual_update", "later"),
                                                ("stage2", "forget_mean_sign", 0),
                                                ("stage2", "alpha", 2.0),
                                                ("stage2", "rcond", 0.0)])
def test_assigned_config_fields_are_validated_at_unlearn_entry(small, stage, name, value):
    cfg = tiny_config()
    setattr(getattr(cfg, stage), name, value)   # no check on assignment ...
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=name):  # ... but before any compute
        ee.unlearn(model, small, cfg, progress=False)
    assert torch.equal(params(model), before)
    with pytest.raises(ValueError, match=name):
        getattr(ee, stage)(model, small, getattr(cfg, stage), progress=False)


def test_preset_takes_stage_overrides_after_the_recipe():
    cfg = ee.UnlearnConfig.preset("digits", "paper", stage1={"lr": 1e-3, "dual_update": "pre"},
                                  stage2={"alpha": 0.2}, seed=3)
    assert (cfg.stage1.lr, cfg.stage1.dual_update, cfg.stage2.alpha, cfg.seed) == (1e-3, "pre", 0.2, 3)
    assert cfg.stage2.w2_scope == "forget_set"            # the rest of the paper recipe stays
    with pytest.raises(ValueError, match=r"unknown Stage1Config field\(s\) \['lrr'\] \(did you mean 'lr'\?\)"):
        ee.UnlearnConfig.preset("digits", stage1={"lrr": 1.0})
    with pytest.raises(ValueError, match="alpha"):
        ee.UnlearnConfig.preset("digits", stage2={"alpha": 2.0})

def test_config_types_and_choices_are_checked_at_construction():
    with pytest.raises(ValueError, match="dual_update"):
        ee.Stage1Config(dual_update="later")
    with pytest.raises(ValueError, match="recipe"):
        ee.UnlearnConfig(recipe="blog")
    with pytest.raises(TypeError, match="epochs"):
        ee.Stage2Config(epochs=1.5)
    with pytest.raises(TypeError, match="use_momentum"):
        ee.Stage2Config(use_momentum="yes")
    with pytest.raises(ValueError, match="lr must be finite"):
        ee.Stage1Config(lr=float("nan"))
    with pytest.raises(TypeError, match="stage1"):
        ee.UnlearnConfig(stage1={"lr": 1e-3})
    cfg = ee.UnlearnConfig()
    cfg.log_every = 0
    with pytest.raises(ValueError, match="log_every"):
        cfg.validate()
    assert ee.Stage2Config().rcond is None   # the projection operator's own default


@pytest.mark.parametrize("make, message", [
    (lambda: ee.Stage2Config(epochs=2.0), "Stage2Config.epochs must be int (an integer: write 2, not 2.0), got 2.0 (float)"),
    (lambda: ee.Stage2Config(epochs=1.5), "Stage2Config.epochs must be int (an integer, not a float), got 1.5 (float)"),
    (lambda: ee.Stage2Config(micro_batch=4.0), "Stage2Config.micro_batch must be int or 'auto' or None (an integer: "
                                               "write 4, not 4.0), got 4.0 (float)"),
    (lambda: ee.Stage1Config(lr="1e-3"), "Stage1Config.lr must be float (finite: NaN/Inf are refused), got '1e-3'"),
    (lambda: ee.Stage1Config(adam_betas=(0.9, "x")), "Stage1Config.adam_betas must be (float, float) (finite: "
                                                     "NaN/Inf are refused), got (0.9, 'x') (tuple)"),
    (lambda: ee.Stage2Config(use_momentum="yes"), "Stage2Config.use_momentum must be bool, got 'yes' (str)"),
    (lambda: ee.UnlearnConfig(stage1={}), "UnlearnConfig.stage1 must be Stage1Config, got {} (dict)"),
])
def test_config_type_errors_say_what_is_accepted(make, message):
    """The type error of a config field says what the field takes and nothing untrue: an int field
    refuses a whole float (and says to write the int), only a float field mentions finiteness."""
    with pytest.raises(TypeError) as ei:
        make()
    assert str(ei.value).startswith(message), str(ei.value)


@pytest.mark.parametrize("make, message", [
    (lambda: ee.Stage1Config(lr=float("inf")), "Stage1Config.lr must be finite (NaN/Inf are refused), got inf"),
    (lambda: ee.Stage2Config(lr=float("nan")), "Stage2Config.lr must be finite (NaN/Inf are refused), got nan"),
    (lambda: ee.Stage1Config(adam_betas=(0.9, float("nan"))),
     "Stage1Config.adam_betas must be finite (NaN/Inf are refused), got (0.9, nan)"),
    (lambda: ee.UnlearnConfig.preset("digits", stage2={"alpha": float("-inf")}), "Stage2Config.alpha must be finite"),
])
def test_a_nan_or_inf_float_field_is_a_value_error(make, message):
    """A NaN / ±Inf is a float of the right type that no range admits: a ValueError, as every other
    out-of-range value (it was a TypeError, "must be float ... got nan (float)")."""
    with pytest.raises(ValueError) as ei:
        make()
    assert str(ei.value).startswith(message), str(ei.value)


# ---------------------------------------------------------------------------------- bad inputs
def test_empty_split_raises(small):
    empty = TensorDataset(torch.zeros(0, 64), torch.zeros(0, dtype=torch.long))
    s = dataclasses.replace(small, adjacent=empty)
    with pytest.raises(ValueError, match="adjacent"):
        ee.unlearn(mlp(), s, tiny_config(), progress=False)


def test_labels_outside_classes_raise(small):
    x, y = small.remote.tensors
    s = dataclasses.replace(small, remote=TensorDataset(x, torch.where(y == 0, 2, y)))
    with pytest.raises(ValueError, match="outside"):
        ee.unlearn(mlp(), s, tiny_config(), progress=False)


def test_non_2d_logits_raise(small):
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(64, 2)

        def forward(self, x):
            return self.l(x).unsqueeze(1)
    with pytest.raises(ValueError, match="2-D logits"):
        ee.unlearn(Bad(), small, tiny_config(), progress=False)


@pytest.mark.parametrize("labels", ["float", "one_hot", "column"])
def test_malformed_labels_raise_value_error(small, labels):
    x, y = small.remote.tensors
    bad = {"float": y.float(), "one_hot": torch.nn.functional.one_hot(y, 2),
           "column": y[:, None]}[labels]
    s = dataclasses.replace(small, remote=TensorDataset(x, bad))
    with pytest.raises(ValueError, match="labels must be integer class indices"):
        ee.unlearn(mlp(), s, tiny_config(), progress=False)


def test_dict_logits_are_accepted(small):
    class DictOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return {"logits": self.net(x)}
    res = ee.unlearn(DictOut(), small, tiny_config(), progress=False)
    assert set(res.report["evals"]) == {"original", "stage1", "stage2", "final"}


def test_non_finite_original_model_is_stopped_before_stage1(small):
    class NaNModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x) * float("nan")
    model = NaNModel()
    before = params(model)
    with pytest.raises(ValueError, match=r"split 'forget'.*non-finite.*20 of 20 samples"):
        ee.unlearn(model, small, tiny_config(), progress=False)
    assert torch.equal(params(model), before)


def test_unlearn_leaves_the_callers_rng_alone(small):
    model = mlp()
    torch.manual_seed(999)
    expected = torch.rand(3)
    torch.manual_seed(999)
    ee.unlearn(model, small, tiny_config(), progress=False)
    assert torch.equal(torch.rand(3), expected)


def test_nan_loss_stops_with_step_and_keeps_checkpoint(small, tmp_path):
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=1, log_every=2)
    with pytest.raises(NonFiniteLossError) as ei:
        ee.unlearn(NaNAfter(3), small, cfg, out_dir=tmp_path, progress=False)   # step 3 is the first bad
    e = ei.value
    assert isinstance(e, ValueError) and e.stage == 1 and e.step == 3
    assert "step 3" in str(e) and e.checkpoint.endswith("stage1_step000003.pt")
    ck = load_checkpoint(e.checkpoint)
    assert all(torch.isfinite(t).all() for t in ck["model"].values())
    assert not (tmp_path / "checkpoints" / "stage1_step000004.pt").exists()


# ---------------------------------------------------------------------------- checkpoint/resume
def test_stage1_checkpoint_carries_the_augmented_lagrangian(small, tmp_path):
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=3)
    res = ee.unlearn(mlp(), small, cfg, out_dir=tmp_path, progress=False)
    mid = load_checkpoint(tmp_path / "checkpoints" / "stage1_step000003.pt")
    done = load_checkpoint(tmp_path / "checkpoints" / "stage1_done.pt")
    al = ee.AugmentedLagrangian(0.0, mu=cfg.stage1.mu, dtype=torch.float32)
    al.load_state_dict(done["lagrangian"])
    assert float(al.lam) == pytest.approx(res.report["lambda_final"], rel=1e-6)
    assert float(al.c0) == pytest.approx(res.report["c0"], rel=1e-6)
    assert int(mid["lagrangian"]["steps"]) == 3 and int(al.steps) == 7
    # the λ logged at step 3 is the multiplier stored after step 3
    lam3 = next(h["lambda"] for h in res.history if h["stage"] == 1 and h["step"] == 3)
    assert float(mid["lagrangian"]["lam"]) == pytest.approx(lam3, rel=1e-6)


class _GradientAscent:
    """A minimal unlearning method on the shared stage loop: SGD ascent on the forget loss."""

    def __init__(self, model, splits, lr=0.05, epochs=3):
        self.model, self.epochs = model, epochs
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)
        self.stream = BatchStream(splits.forget, 8, shuffle=True, seed=0, name="ga", device="cpu")

    def step(self, _, batch):
        from entangle_ext.unlearn.losses import per_sample_ce
        ce = per_sample_ce(self.model, batch).mean()
        self.opt.zero_grad()
        (-ce).backward()
        self.opt.step()
        return -ce, [ce]

    def run(self, resume_state=None, **loop_args):
        loop = StageLoop("ga", "GA", ["forget_ce"], progress=False, **loop_args)
        return loop.run(self.stream, self.epochs, self.step, resume_state=resume_state,
                        objects={"model": self.model, "optimizer": self.opt})


def test_stage_loop_runs_another_method_with_checkpoint_and_resume(small, tmp_path):
    full = _GradientAscent(mlp(), small)
    steps, history = full.run(log_every=2)
    assert steps == 9 and [h["step"] for h in history] == list(range(9))
    assert history[-1]["forget_ce"] > history[0]["forget_ce"]          # ascent raises the loss
    saved = {}
    part = _GradientAscent(mlp(), small)
    part.run(log_every=4, checkpoint_every=5, checkpoint_fn=lambda step, st: saved.update(copy.deepcopy(st)))
    assert saved["step"] == 5 and saved["stage"] == "ga" and len(saved["history"]) == 5
    resumed = _GradientAscent(mlp(seed=7), small)
    steps, hist = resumed.run(resume_state=saved)
    assert steps == 9 and hist == history
    torch.testing.assert_close(params(resumed.model), params(full.model), rtol=0, atol=0)


def test_stage_loop_stops_at_the_first_non_finite_step(small):
    calls = []

    def step(i, batch):
        calls.append(i)
        return torch.tensor(float("nan") if i >= 4 else 1.0), []
    stream = BatchStream(small.forget, 2, shuffle=False, seed=0, name="t", device="cpu")
    with pytest.raises(NonFiniteLossError, match="non-finite loss in ga at step 4") as ei:
        StageLoop("ga", "t", [], log_every=3, progress=False).run(stream, 1, step, objects={})
    assert ei.value.step == 4 and calls == list(range(6))   # detected at the next log point


def test_paper_recipe_runs(small):
    r = ee.unlearn(mlp(), small, tiny_config(recipe="paper"), progress=False)
    assert r.report["config"]["stage2"]["w2_scope"] == "forget_set"
    assert all(torch.isfinite(p).all() for p in r.model.parameters())


# ---------------------------------------------------------------------------------- dict batches
class HFStyle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, pixels):
        return SimpleNamespace(logits=self.net(pixels))


def test_dict_batches_match_tuple_batches(small):
    ds = ee.Splits(**{k: DictDS(v) for k, v in small.named().items()})
    a, b = HFStyle(), mlp()
    ra = ee.unlearn(a, ds, tiny_config(), progress=False)
    rb = ee.unlearn(b, small, tiny_config(), progress=False)
    torch.testing.assert_close(params(ra.model), params(rb.model), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ CIFAR-100
@pytest.mark.data
def test_cifar100_npz_splits():
    from entangle_ext.data.cifar100 import cifar100_splits, find_cifar100
    src = find_cifar100(SHARED_DATA)
    if src is None:
        pytest.skip(f"no CIFAR-100 under {SHARED_DATA}")
    s, info = cifar100_splits(src, superclasses=["fish", "flowers", "insects"], max_train_per_class=10,
                              max_test_per_class=4)
    assert info["groups"]["adjacent"] == ["flatfish", "ray", "shark", "trout"]
    assert info["num_classes"] == 3
    assert info["sizes"] == {"forget": 10, "adjacent": 40, "remote": 100, "forget_test": 4,
                             "adjacent_test": 16, "remote_test": 40}
    x, y = s.forget.tensors
    assert x.shape == (10, 3, 32, 32) and x.dtype == torch.float32 and (y == 0).all()
    assert set(s.remote.tensors[1].tolist()) == {1, 2}


def test_cifar100_pickle_format(tmp_path):
    """torchvision's cifar-100-python/ pickles, written here from synthetic arrays."""
    import pickle

    import numpy as np
    from entangle_ext.data.cifar100 import cifar100_splits, load_cifar100
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    rng = np.random.default_rng(0)
    f2c = np.arange(100) % 20
    f2c[1] = 1   # aquarium_fish in coarse 1 ("fish"), as in CIFAR-100
    for split, n in (("train", 400), ("test", 200)):
        fine = np.arange(n) % 100
        pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                     b"fine_labels": fine.tolist(), b"coarse_labels": f2c[fine].tolist()},
                    open(root / split, "wb"))
    names = [f"c{i}" for i in range(100)]
    names[1] = "aquarium_fish"
    pickle.dump({b"fine_label_names": [n.encode() for n in names],
                 b"coarse_label_names": [f"s{i}".encode() for i in range(20)]}, open(root / "meta", "wb"))
    d = load_cifar100(tmp_path)
    assert d["x_train"].shape == (400, 32, 32, 3) and d["fine_names"][1] == "aquarium_fish"
    s, info = cifar100_splits(data=d)
    assert info["sizes"]["forget"] == 4 and info["sizes"]["adjacent"] == 16
    assert info["num_classes"] == 20


# --------------------------------------------------------------------------- no host sync (CUDA)
@pytest.mark.cuda
def test_steps_do_not_sync_on_cuda(small, monkeypatch):
    """Inside stage steps nothing reads device values back: CUDA sync debug mode "error" raises on
    any synchronising call; only the periodic flush (log_every) is allowed to sync."""
    from entangle_ext.unlearn import loop, stages

    dev = torch.device("cuda")
    s = ee.Splits(**{k: TensorDataset(*[t.to(dev) for t in v.tensors]) for k, v in small.named().items()})

    def allow_sync(fn):
        def wrapped(*args, **kwargs):
            torch.cuda.set_sync_debug_mode(0)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("error")
        return wrapped
    monkeypatch.setattr(loop._Monitor, "flush", allow_sync(loop._Monitor.flush))
    cfg = tiny_config()
    model = mlp().to(dev)
    c0 = stages.remote_loss_c0(model, s.remote, dev)
    torch.cuda.set_sync_debug_mode("error")
    try:
        ee.stage1(model, s, cfg.stage1, c0=c0, progress=False, log_every=100)
        ee.stage2(model, s, cfg.stage2, progress=False, log_every=100)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("case", ["full", "parallel", "zero_one", "zero_both"])
def test_projection_degenerate_bases(case):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
    basis = {"full": [a, b], "parallel": [a, -3 * a], "zero_one": [a, torch.zeros(7, dtype=torch.float64)],
             "zero_both": [torch.zeros(7, dtype=torch.float64)] * 2}[case]
    v = torch.randn(7, generator=g, dtype=torch.float64)
    x = [v.clone()]
    ee.project_orthogonal_(x, [[t] for t in basis], rcond=1e-10)
    B = torch.stack(basis)
    want = v - torch.linalg.pinv(B) @ (B @ v) if B.abs().sum() > 0 else v
    torch.testing.assert_close(x[0], want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scope, want", [("minibatch", [16] * 3), ("forget_set", [20] * 3)])
def test_the_paper_recipes_w2_covers_the_whole_forget_set(small, monkeypatch, scope, want):
    """w2_scope="forget_set" (the paper text: one W2 over the whole forget set) took only the
    forget_batch_limit batches drawn in the step (here 2 × 8 of the 20 forget samples), the same
    samples as the reference recipe. Now every batch of the pass enters, in the run and in the
    naive transcription's batch order alike."""
    from entangle_ext.reference.unlearn import driver_order_stage2
    from entangle_ext.unlearn import stages
    seen = []
    real = stages.forget_grad

    def counting(model, params, batches, b_ref, sizes, config):
        seen.append(sum(sizes))
        assert len(b_ref) == sum(sizes)
        return real(model, params, batches, b_ref, sizes, config)
    monkeypatch.setattr(stages, "forget_grad", counting)
    cfg = tiny_config(run_stage1=False, stage2={"w2_scope": scope})   # forget batches 8, limit 2; 20 forget samples
    ee.unlearn(mlp(), small, cfg, progress=False)
    assert seen == want
    order = driver_order_stage2(small, cfg.stage2, seed=cfg.seed)
    assert [sum(len(b[1]) for b in fbs) for _, fbs, _ in order] == want


def test_the_whole_forget_set_is_cut_into_reference_sized_passes_off_the_cpu(small, monkeypatch):
    """Off the CPU micro_batch="auto" is one pass; over the whole forget set (3000 Tiny-ImageNet
    images at 224 px through a ViT) that would be one forward pass of all of them. "auto" now makes
    no pass larger than a reference step's forget_batch_size x forget_batch_limit samples."""
    from entangle_ext.unlearn import stages
    monkeypatch.setattr(stages, "auto_micro_batch", lambda model, batch: None)   # as on a GPU
    seen = []
    real = stages.forget_grad

    def spy(model, params, batches, b_ref, sizes, config):
        seen.append(config.micro_batch)
        return real(model, params, batches, b_ref, sizes, config)
    monkeypatch.setattr(stages, "forget_grad", spy)
    for scope, want in (("forget_set", 16), ("minibatch", None)):
        seen.clear()
        ee.unlearn(mlp(), small, tiny_config(run_stage1=False, stage2={"w2_scope": scope}), progress=False)
        assert seen == [want] * 3, scope
