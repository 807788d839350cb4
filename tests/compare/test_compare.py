"""entangle_ext.compare: a reduced comparison (three methods, two seeds, a tiny MLP on digits), its
table / JSON / PNG, the per-run cache (resume, invalidation), what the methods registry is called
with (seeds, presets, Retrain's recipe) and the ``entangle-unlearn compare`` command."""
import copy
import dataclasses
import importlib
import json
import warnings

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext import cli
from entangle_ext.data.digits import digits_splits
from entangle_ext.compare_report import format_markdown
from entangle_ext.methods import available_methods, get_method
from entangle_ext.methods.retrain import RetrainConfig
from entangle_ext.settings import get_setting
from entangle_ext.train import TrainRecipe, train_original
from entangle_ext.unlearn import metrics as M

from _tiny import DictDS, mlp, tiny_config

C = importlib.import_module("entangle_ext.compare")   # the module (the package attribute is the function)

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


@pytest.fixture(autouse=True)
def _needs_metrics_packages(one_thread):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")


RECIPE = TrainRecipe("adam", lr=1e-2, epochs=30, batch_size=64, schedule="constant")


@pytest.fixture(scope="module")
def setup():
    s, _ = digits_splits(max_train_per_digit=20)
    net = mlp()
    train_original(net, [s.forget, s.adjacent, s.remote], RECIPE, progress=False)
    return s, net


def two_stage_config():
    return tiny_config(stage1={"epochs": 2, "lr": 1e-2}, log_every=10)


def retrain_spec(calls=None, epochs=RECIPE.epochs):
    """A stand-in for the registry's Retrain: a fresh MLP trained on D \\ D_f only."""
    def run(model, splits, *, seed, device, progress):
        if calls is not None:
            calls.append(("retrain", seed))
        fresh = mlp(100 + seed)
        train_original(fresh, [splits.adjacent, splits.remote], RECIPE.replace(epochs=epochs), seed=seed,
                       progress=False)
        return ee.UnlearnResult(model=fresh, report={"timings_s": {"unlearn": 0.5}})
    return C.MethodSpec("retrain", run, {"epochs": epochs})


def noise_spec(calls, scale=0.05, fail_on=()):
    """A fake baseline: seeded Gaussian noise on the weights; records what it was given."""
    def run(model, splits, *, seed, device, progress):
        if seed in fail_on:
            raise RuntimeError("interrupted")
        calls.append(("noise", seed, C.fingerprint(model, splits)))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(scale * torch.randn(p.shape, generator=g))
        return ee.UnlearnResult(model=model, report={})
    return C.MethodSpec("noise", run, {"scale": scale})


def test_only_results_made_before_the_invocation_are_listed_as_cached(setup, tmp_path):
    """The records the ``--jobs`` workers of the same command wrote (same ``session``) are computed
    now, not "cached"; a later invocation (another session, or none) lists them as cached."""
    s, net = setup
    kw = dict(seeds=[0, 1], out_dir=tmp_path, progress=False, relearn=False)
    calls = []
    for seed in (0, 1):   # what two workers do: one (method, seed) each, no tables
        ee.compare(net, s, [noise_spec(calls)], seeds=[seed], out_dir=tmp_path, progress=False, relearn=False,
                   write_tables=False, session="q1")
    assert [c[:2] for c in calls] == [("noise", 0), ("noise", 1)]
    now = ee.compare(net, s, [noise_spec(calls)], session="q1", **kw)   # the parent of those workers
    assert len(calls) == 2 and "cached" not in now.table
    assert "cached" not in (tmp_path / "comparison.md").read_text()
    for later in ("q2", None):
        again = ee.compare(net, s, [noise_spec(calls)], session=later, **kw)
        assert len(calls) == 2 and again.table.endswith(
            f"cached: original seeds 0,1; noise seeds 0,1 (from {tmp_path / 'cache'}; delete to recompute)")
    mixed = ee.compare(net, s, [noise_spec(calls, scale=0.1)], session="q3", **kw)   # noise recomputed now
    assert len(calls) == 4 and mixed.table.endswith("cached: original seeds 0,1 (from "
                                                    f"{tmp_path / 'cache'}; delete to recompute)")


def fresh_mlp():
    """Retrain's model_fn: unseeded, so its initial weights come from the run's seed."""
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


def test_reduced_comparison(setup, tmp_path):
    s, net = setup
    before = copy.deepcopy(net.state_dict())
    res = ee.compare(net, s, ["retrain", "two_stage", "rl"], seeds=[0, 1], setting="digits",
                     configs={"two_stage": two_stage_config()}, model_fn=fresh_mlp, retrain_recipe=RECIPE,
                     out_dir=tmp_path, progress=False)
    assert res.methods == ["retrain", "original", "two_stage", "rl"] and res.seeds == [0, 1]
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())      # θ0 untouched
    for seed in (0, 1):
        ref, two = res.runs["retrain"][seed], res.runs["two_stage"][seed]
        assert "avg_gap" not in ref and ref["time_s"] > 0 and res.runs["original"][seed]["time_s"] is None
        assert two["avg_gap"] == pytest.approx(M.average_gap(two, ref)) and 0 <= two["forget_quality"] <= 1
    two = [res.runs["two_stage"][k] for k in (0, 1)]
    assert {k: v for k, v in two[0].items() if k != "time_s"} != {k: v for k, v in two[1].items() if k != "time_s"}
    m = res.summary["two_stage"]["acc_forget_test"]
    vals = torch.tensor([t["acc_forget_test"] for t in two], dtype=torch.float64)
    assert m["mean"] == pytest.approx(float(vals.mean())) and m["std"] == pytest.approx(float(vals.std()))
    assert res.summary["two_stage"]["UA"]["mean"] > res.summary["original"]["UA"]["mean"]   # it unlearned
    # the seed reaches every method through the registry: its own config and its run differ by seed
    for name in ("retrain", "two_stage", "rl"):
        r0, r1 = (json.loads((tmp_path / "cache" / name / f"seed{k}.json").read_text())["report"] for k in (0, 1))
        assert r0["method"] == name and (r0["config"]["seed"], r1["config"]["seed"]) == (0, 1)
        assert r0["evals"]["final"]["forget"]["loss"] != r1["evals"]["final"]["forget"]["loss"]
    assert res.hparams["retrain"]["config"]["recipe"] == RECIPE.to_dict()
    rl = get_method("rl").config_for("digits").to_dict()
    assert res.hparams["rl"]["config"] == {k: v for k, v in rl.items() if k != "seed"}
    lines = res.table.splitlines()
    assert lines[0].startswith("| method | forget test acc ↓ | adjacent test acc ↑")
    assert [ln.split("|")[1].strip() for ln in lines[2:6]] == ["retrain", "original", "two_stage", "rl"]
    assert "**" not in lines[2] + lines[3] and "Bold rule:" in res.table            # never the references
    loose = format_markdown(res.summary, seeds=[0, 1], order=res.methods, band=None).splitlines()   # no band:
    assert "**" in loose[4] + loose[5] and "**" not in loose[2] + loose[3]         # best: not the references
    assert "↑ higher is better" in res.table
    js = json.loads((tmp_path / "comparison.json").read_text())
    assert js["summary"] == json.loads(json.dumps(res.summary)) and js["metrics"]["mia_forget"]["direction"] == "up"
    assert js["hparams"]["two_stage"]["config"]["stage2"]["epochs"] == 1
    assert (tmp_path / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "comparison.md").read_text().strip() == res.table


def test_cache_resume_and_invalidation(setup, tmp_path, monkeypatch):
    s, net = setup
    calls = []
    kw = dict(seeds=[0, 1], out_dir=tmp_path, progress=False, relearn={"max_steps": 5})
    with pytest.raises(RuntimeError, match="interrupted"):           # dies at (noise, seed 1)
        ee.compare(net, s, [retrain_spec(calls), noise_spec(calls, fail_on=(1,))], **kw)
    assert calls[:2] == [("retrain", 0), ("retrain", 1)] and [c[:2] for c in calls[2:]] == [("noise", 0)]
    assert calls[2][2] == C.fingerprint(net, s)                      # each run starts from θ0
    calls.clear()
    first = ee.compare(net, s, [retrain_spec(calls), noise_spec(calls)], **kw)
    assert [c[:2] for c in calls] == [("noise", 1)]                  # resumed where it stopped
    assert calls[0][2] == C.fingerprint(net, s)

    def boom(*a, **k):
        raise AssertionError("should have come from the cache")
    monkeypatch.setattr(C, "_run_one", boom)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                # same torch, same device: silent
        again = ee.compare(net, s, [retrain_spec(calls), noise_spec(calls)], **kw)
    table, note = again.table.split("\n\ncached: ")
    assert again.summary == first.summary and table == first.table.split("\n\ncached: ")[0]
    assert note.startswith("retrain seeds 0,1; original seeds 0,1; noise seeds 0,1 (from ")   # the table says what was reused
    rec_path = tmp_path / "cache" / "noise" / "seed1.json"
    rec = json.loads(rec_path.read_text())
    assert rec["env"] == {"torch": torch.__version__, "device": "cpu"}   # noted, not in the key
    rec_path.write_text(json.dumps(dict(rec, env={"torch": "2.0.0", "device": "cuda"})))
    with pytest.warns(UserWarning, match=r"cached noise seed 1 made with torch 2.0.0 on cuda .*delete .*seed1.json"):
        again = ee.compare(net, s, [retrain_spec(calls), noise_spec(calls)], **kw)
    assert again.summary == first.summary                             # reused all the same
    monkeypatch.undo()
    calls.clear()
    ee.compare(net, s, [retrain_spec(calls), noise_spec(calls, scale=0.1)], **kw)   # new hyperparameters
    assert [c[:2] for c in calls] == [("noise", 0), ("noise", 1)]
    calls.clear()
    ee.compare(net, s, [retrain_spec(calls, epochs=20), noise_spec(calls, scale=0.1)], **kw)   # new reference:
    assert sorted(c[:2] for c in calls) == [("retrain", 0), ("retrain", 1)]   # Retrain alone reruns (cache format 5)
    calls.clear()
    other = copy.deepcopy(net)
    with torch.no_grad():
        other[0].bias.add_(1e-3)
    ee.compare(other, s, [noise_spec(calls, scale=0.1)], **kw)       # another original model
    assert [c[:2] for c in calls] == [("noise", 0), ("noise", 1)]


def test_bad_input(setup):
    s, net = setup
    with pytest.raises(ValueError, match="unknown method 'bogus'.*two_stage"):
        ee.compare(net, s, ["bogus"], progress=False)
    with pytest.raises(ValueError, match="seeds"):
        ee.compare(net, s, ["two_stage"], seeds=[], progress=False)
    with pytest.raises(ValueError, match="distinct"):
        ee.compare(net, s, ["two_stage", "two_stage"], progress=False)
    with pytest.raises(ValueError, match="held-out"):
        ee.compare(net, dataclasses.replace(s, adjacent_test=None, remote_test=None), ["two_stage"], progress=False)
    with pytest.raises(TypeError, match=r"seeds must be a sequence of integers.*--seeds N means range\(N\)"):
        ee.compare(net, s, ["ga"], seeds=2, setting="digits", progress=False)
    with pytest.raises(TypeError, match=r"seeds must be integers, got \[0.7\]"):
        ee.compare(net, s, ["ga"], seeds=[0.7], setting="digits", progress=False)
    with pytest.raises(ValueError, match=r"seeds must lie in .*torch.manual_seed's range\), got \[1180591620717411303424\]"):
        ee.compare(net, s, ["ga"], seeds=[0, 2 ** 70], setting="digits", progress=False)
    with pytest.raises(ValueError, match=r"configs has entries for methods that are not compared: \['gaa'\]"):
        ee.compare(net, s, ["ga"], setting="digits", configs={"gaa": get_method("ga").Config()}, progress=False)
    with pytest.raises(ValueError, match=r"relearn has unknown keys \['steps'\]"):
        ee.compare(net, s, ["ga"], setting="digits", relearn={"steps": 5}, progress=False)
    with pytest.raises(ValueError, match=r"max_steps must be an int >= 0, got -1"):
        ee.compare(net, s, ["ga"], setting="digits", relearn={"max_steps": -1}, progress=False)
    with pytest.raises(ValueError, match=r"compare: batch_size"):
        ee.compare(net, s, ["ga"], setting="digits", batch_size=0, progress=False)
    with pytest.raises(ValueError, match=r"mia_max_samples must be None or an int >= 1, got 0"):
        ee.compare(net, s, ["ga"], setting="digits", mia_max_samples=0, progress=False)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        ee.compare(net, s, ["ga"], setting="digits", relearn={"fraction": 1.5}, progress=False)
    assert ee.compare(net, s, ["ga"], seeds=range(1), setting="digits", relearn=False,
                      progress=False).seeds == [0]                              # any integer sequence
    for miss in ("forget", "adjacent", "remote"):       # even for methods that would not read it
        with pytest.raises(ValueError, match=f"split '{miss}' is required by compare"):
            ee.compare(net, dataclasses.replace(s, **{miss: None}), ["ga"], setting="digits", progress=False)
    with pytest.raises(ValueError, match="hparams"):
        ee.compare(net, s, ["ga"], setting="digits", hparams="blog", progress=False)
    with pytest.raises(ValueError, match="no variant 'huge'"):
        ee.compare(net, s, ["ga"], setting="digits", variant="huge", progress=False)
    with pytest.raises(ValueError, match="no preset for setting 'mnist'"):
        ee.compare(net, s, ["ga"], setting="mnist", progress=False)
    with pytest.raises(TypeError, match="'ft'"):                   # before any run starts
        ee.compare(net, s, ["two_stage", "ft"], configs={"ft": get_method("ga").Config()},
                   progress=False)


def _width_5(n, c):
    return TensorDataset(torch.randn(n, 5), torch.full((n,), c))


@pytest.mark.parametrize("case", ["feature width", "dict inputs"])
@pytest.mark.parametrize("relearn", [False, None])
def test_a_model_that_cannot_take_a_split_is_refused_as_unlearn_refuses_it(small, tmp_path, case, relearn):
    """compare ran the model (its fingerprint, the relearn threshold) before the input checks of
    `unlearn`, so a split the model cannot take was a bare RuntimeError ("mat1 and mat2 shapes cannot be
    multiplied") or TypeError ("forward() got an unexpected keyword argument"); now the ValueError of
    `unlearn` naming the split, before anything is written."""
    if case == "feature width":   # a model of input width 8, splits of width 5
        s = ee.Splits(forget=_width_5(20, 0), adjacent=_width_5(20, 0), remote=_width_5(20, 1),
                      remote_test=_width_5(20, 1))
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        says = r"shape \(2, 5\) torch.float32; .*: mat1 and mat2 shapes cannot be multiplied"
    else:                         # dict items, a forward that takes one positional tensor
        s = ee.Splits(**{n: DictDS(getattr(small, n)) for n in ("forget", "adjacent", "remote", "remote_test")})
        model = mlp()
        says = r"pixels: shape \(2, 64\) torch.float32; .*unexpected keyword argument 'pixels'"
    says = r"^split 'forget': the model \(Sequential\) cannot take this split's inputs \(" + says
    with pytest.raises(ValueError, match=says) as by_unlearn:
        ee.unlearn(copy.deepcopy(model), s, setting="digits", progress=False)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=says) as by_compare:
        ee.compare(model, s, methods=["ga"], seeds=[0], setting="digits", relearn=relearn, out_dir=out,
                   progress=False)
    assert str(by_compare.value) == str(by_unlearn.value)
    assert not out.exists()   # no cache file, no lock, no table


def test_method_registry(setup, monkeypatch, tmp_path):
    """Names come from entangle_ext.methods; each run is ``unlearn(..., method=name, seed=seed)``
    with Retrain's recipe and model_fn, the baselines' hparams preset, the two-stage recipe of
    hparams; the cache key follows the effective hyperparameters (an edited preset reruns)."""
    s, net = setup
    assert C.available_methods() == available_methods() and len(available_methods()) == 17
    seen = []

    def fake_unlearn(model, splits, config=None, **kw):
        seen.append(dict(config=config, **kw))
        return ee.UnlearnResult(model=model, report={"method": kw["method"], "timings_s": {"unlearn": 2.0}})

    monkeypatch.setattr(importlib.import_module("entangle_ext.compare_specs"), "unlearn", fake_unlearn)
    build = lambda: mlp(7)   # noqa: E731
    kw = dict(seeds=[3, 4], setting="digits", hparams="original", model_fn=build, relearn=False, progress=False,
              out_dir=tmp_path)
    res = ee.compare(net, s, ["retrain", "ga", "two_stage", "no_w2"], retrain_recipe=RECIPE, **kw)
    by = {(d["method"], d["seed"]): d for d in seen}
    assert sorted(by) == sorted((m, k) for m in ("retrain", "ga", "two_stage", "no_w2") for k in (3, 4))
    r = by["retrain", 3]
    assert r["model_fn"] is build and type(r["config"]) is RetrainConfig and r["config"].recipe == RECIPE
    g = by["ga", 4]
    assert g["config"] is None and g["hparams"] == "original" and g["setting"] == "digits" and g["model_fn"] is None
    t = by["two_stage", 3]["config"]
    assert isinstance(t, ee.UnlearnConfig) and t.recipe == "paper" and t == get_setting("digits").config(
        recipe="paper", seed=t.seed)                                    # the hparams recipe, seed per run
    assert res.hparams["no_w2"]["config"]["stage2"]["alpha"] == 0.0                  # effective: rewritten
    assert res.hparams["ga"]["config"]["lr"] == get_method("ga").config_for("digits", "original").lr
    assert res.runs["ga"][3]["time_s"] == 2.0 and "relearn_steps" not in res.runs["ga"][3]
    seen.clear()
    ee.compare(net, s, ["retrain", "ga", "two_stage", "no_w2"], retrain_recipe=RECIPE, **kw)
    assert seen == []                                                   # all from the cache
    monkeypatch.setitem(get_method("ga").presets["digits"], "original",
                        {**get_method("ga").presets["digits"]["original"], "lr": 0.123})
    ee.compare(net, s, ["retrain", "ga", "two_stage", "no_w2"], retrain_recipe=RECIPE, **kw)
    assert sorted((d["method"], d["seed"]) for d in seen) == [("ga", 3), ("ga", 4)]   # edited preset: rerun
    # no recipe given: Retrain trains with the recipe of the setting's variant (settings registry)
    seen.clear()
    ee.compare(net, s, ["retrain"], seeds=[0], setting="digits", variant="reduced", relearn=False, progress=False)
    assert seen[0]["config"].recipe == get_setting("digits").variant("reduced").recipe and seen[0]["seed"] == 0


@pytest.mark.parametrize("first", [True, False])
def test_cache_key_holds_what_amp_auto_runs_as(setup, monkeypatch, tmp_path, first):
    """A config's amp="auto" enters the cache key as what it runs as on the comparison's device
    ("bf16" where the CPU has bfloat16 matrix units, None elsewhere): a record made under bf16
    autocast is not reused on a machine where "auto" runs float32, nor the other way round; on the
    same kind of machine it is, and it is the record of an explicit amp="bf16" / None run."""
    from entangle_ext.compare_cache import resolved_amp_fields
    from entangle_ext.unlearn import precision
    s, net = setup
    seen = []

    def fake_unlearn(model, splits, config=None, **kw):
        seen.append(config.amp)
        return ee.UnlearnResult(model=model, report={"timings_s": {"unlearn": 1.0}})

    monkeypatch.setattr(importlib.import_module("entangle_ext.compare_specs"), "unlearn", fake_unlearn)
    ft = get_method("ft").config_for("digits").replace(epochs=1)
    kw = dict(seeds=[0], setting="digits", relearn=False, progress=False, out_dir=tmp_path)

    def run(has, amp):
        monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: has)
        seen.clear()
        ee.compare(net, s, ["ft"], configs={"ft": ft.replace(amp=amp)}, **kw)
        return list(seen)

    assert run(first, "auto") == ["auto"]                       # computed
    assert run(first, "auto") == []                             # same machine kind: from the cache
    assert run(not first, "auto") == ["auto"]                   # the other kind: recomputed
    assert run(first, "bf16" if first else None) == ["bf16" if first else None]   # its own record...
    assert run(first, "auto") == []                             # ...is the one "auto" runs as here
    # the helper, at any depth; nothing else changes
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: True)
    hp = {"config": {"amp": "auto", "stage1": {"amp": "auto"}, "l": [{"amp": "auto"}], "lr": 0.1}, "amp": None}
    assert resolved_amp_fields(hp, "cpu") == {"config": {"amp": "bf16", "stage1": {"amp": "bf16"},
                                                         "l": [{"amp": "bf16"}], "lr": 0.1}, "amp": None}
    assert resolved_amp_fields(hp, "cpu", torch.float64)["config"]["amp"] is None   # autocast leaves float64
    assert hp["config"]["amp"] == "auto"                        # the input is not modified


def test_cli_compare(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    argv = ["compare", "--setting", "digits", "--variant", "reduced", "--methods", "retrain,two_stage", "--seeds",
            "1", "--out", str(out), "--no-progress", "--relearn-steps", "5"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "| two_stage |" in text and "| retrain |" in text and "↓" in text and (out / "comparison.png").exists()
    assert len(list((out / "cache").glob("*/seed0.json"))) == 3      # retrain + original + two_stage
    ret = json.loads((out / "cache" / "retrain" / "seed0.json").read_text())["report"]
    assert ret["config"]["recipe"] == get_setting("digits").variant("reduced").recipe.to_dict()
    monkeypatch.setattr(C, "_run_one", lambda *a, **k: pytest.fail("not resumed from the cache"))
    assert cli.main(argv) == 0
    assert cli.main(["compare", "--setting", "digits", "--methods", "nope", "--out", str(out)]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--threads", "-3"], "--threads must be an integer in [1, 1024]"),
    (["--threads", "0"], "--threads must be an integer in [1, 1024]"),
    (["--threads", "100000"], "--threads must be an integer in [1, 1024]"),   # was: "needs scikit-learn", SIGSEGV
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
    (["--relearn-steps", "0"], "--relearn-steps must be >= 1"),
    (["--mia-max-samples", "0"], "--mia-max-samples must be >= 1"),
    (["--device", "gpu0"], "--device 'gpu0' is not a device"),
    (["--device", "cuda:99"], "--device cuda:99"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--budget", "0"], "budget must be a finite number > 0"),
    (["--budget", "-0.5"], "budget must be a finite number > 0"),
    (["--budget", "nan"], "budget must be a finite number > 0"),
    (["--budget", "inf"], "--budget must be a finite number > 0"),
    (["--budget", "1e308"], "training passes is not a finite number of passes"),   # was OverflowError
    # method names were checked only after the data and original model were ready
    (["--methods", "ga,nope"], "--methods: unknown method 'nope'"),
    (["--methods", "ft,,ga"], "--methods 'ft,,ga' has an empty entry"),   # was silently dropped
    (["--methods", "ft,ga,ft", "--jobs", "2"], "--methods names ft more than once"),
    (["--methods", "original,ga"], "'original' is not a method"),
    (["--methods", " , "], "--methods is empty"),
])
def test_cli_compare_flags_are_one_line_errors_before_any_data(tmp_path, capsys, monkeypatch, flags, message):
    import entangle_ext.settings as S
    monkeypatch.setattr(S, "prepare", lambda *a, **k: pytest.fail("data loaded before the flags were checked"))
    before = torch.get_num_threads()
    assert cli.main(["compare", "--setting", "digits", "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("entangle-unlearn compare: error: ") and message in err and err.count("\n") == 1
    assert torch.get_num_threads() == before


def test_cli_compare_out_must_be_a_directory_and_threads_are_restored(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert cli.main(["compare", "--setting", "digits", "--out", str(f)]) == 2
    assert f"--out {f} exists and is not a directory" in capsys.readouterr().err
    before = torch.get_num_threads()
    argv = ["compare", "--setting", "digits", "--variant", "reduced", "--methods", "delete", "--seeds", "1",
            "--out", str(tmp_path / "cmp"), "--no-progress", "--no-relearn", "--threads", str(before + 1)]
    assert cli.main(argv) == 0 and torch.get_num_threads() == before


def test_a_diverging_method_is_recorded_not_fatal(setup, tmp_path):
    """A run that stops on a non-finite loss is a result: the comparison goes on, the failure is
    cached (not rerun), its cells are "–" and it is listed under the table and in the JSON."""
    s, net = setup
    calls = []

    def run(model, splits, *, seed, device, progress):
        calls.append(seed)
        if seed == 1:
            raise ee.NonFiniteLossError("ga", 7, None)
        return ee.UnlearnResult(model=model, report={})
    spec = C.MethodSpec("ga_like", run, {})
    kw = dict(seeds=[0, 1], out_dir=tmp_path, progress=False, relearn=False)
    res = ee.compare(net, s, [retrain_spec(), spec], **kw)
    msg = "non-finite loss in ga at step 7; stopped (no checkpoint was written)"
    assert calls == [0, 1] and res.failures == {"ga_like": {1: msg}}
    assert res.runs["ga_like"][1] == {} and res.summary["ga_like"]["acc_forget_test"]["n"] == 1
    assert "- ga_like, seed 1: non-finite loss in ga at step 7" in res.table
    js = json.loads((tmp_path / "comparison.json").read_text())
    assert js["failures"] == {"ga_like": {"1": msg}}
    again = ee.compare(net, s, [retrain_spec(), spec], **kw)
    assert calls == [0, 1] and again.failures == res.failures          # cached, not rerun

    def overflow(model, splits, *, seed, device, progress):     # weights past float range, no NaN loss
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(3e38)
        return ee.UnlearnResult(model=model, report={})
    res = ee.compare(net, s, [retrain_spec(), C.MethodSpec("overflow", overflow, {})], seeds=[0],
                     progress=False, relearn=False)
    assert list(res.failures) == ["overflow"]
    assert "overflow: the unlearned model returns non-finite logits" in res.failures["overflow"][0]

    def boom(model, splits, *, seed, device, progress):
        raise RuntimeError("other errors still stop the comparison")
    with pytest.raises(RuntimeError, match="still stop"):
        ee.compare(net, s, [retrain_spec(), C.MethodSpec("boom", boom, {})], **kw)


@pytest.mark.parametrize("relearn", [False, None])
def test_a_model_without_trainable_parameters_is_refused_before_anything_runs(small, tmp_path, relearn):
    """A frozen model and a registered method: `unlearn`'s ValueError, raised before the fingerprint,
    the relearn threshold or the out dir (it came from the first run, after the cache dir was made)."""
    model = mlp()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters") as by_unlearn:
        ee.unlearn(copy.deepcopy(model), small, setting="digits", progress=False)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="no trainable parameters") as by_compare:
        ee.compare(model, small, methods=["ga"], seeds=[0], setting="digits", relearn=relearn, out_dir=out,
                   progress=False)
    assert str(by_compare.value) == str(by_unlearn.value)
    assert not out.exists()
