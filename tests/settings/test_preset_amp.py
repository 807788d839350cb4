"""Issue 22 item 1: ``amp="auto"`` (bfloat16 autocast where the device has bfloat16 matrix units,
float32 elsewhere) and the CPU presets that use it (`Variant.amp`): the two-stage config, every
baseline's config (CLI and compare) and the original model's recipe, resolved per device."""
import pytest
import torch

import entangle_ext as ee
from entangle_ext.compare_specs import method_config
from entangle_ext.methods import get_method
from entangle_ext.settings import SETTINGS, get_setting, prepare
from entangle_ext.train import TrainRecipe
from entangle_ext.unlearn import precision
from entangle_ext.unlearn.precision import resolve_amp

from _tiny import AutocastProbe, mlp, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

CPU_PRESETS = {("cifar100", "cpu")}   # the one with a 3-seed side-by-side (README)


@pytest.mark.parametrize("has", [True, False])
def test_resolve_amp(monkeypatch, has):
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: has)
    assert resolve_amp("auto", "cpu") == ("bf16" if has else None)
    assert resolve_amp("auto", torch.device("cpu")) == ("bf16" if has else None)
    assert resolve_amp(None, "cpu") is None and resolve_amp("bf16", "cpu") == "bf16"
    assert resolve_amp("auto", "meta") is None
    with pytest.raises(ValueError, match="amp must be None or one of"):
        resolve_amp("fp16", "cpu")


def test_auto_is_a_value_of_every_amp_field():
    assert ee.UnlearnConfig(amp="auto").amp == "auto"
    assert TrainRecipe(amp="auto").amp == "auto"
    assert get_method("ft").Config(amp="auto").amp == "auto"
    with pytest.raises(ValueError):
        ee.UnlearnConfig(amp="fp16")


@pytest.mark.parametrize("has", [True, False])
def test_auto_runs_bf16_only_where_the_cpu_has_it(small, monkeypatch, has):
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: has)
    seen = []
    for method, cfg in (("two_stage", tiny_config(amp="auto")),
                        ("ft", get_method("ft").config_for("digits", amp="auto").replace(epochs=1))):
        seen.clear()
        r = ee.unlearn(AutocastProbe(seen), small, cfg, method=method, progress=False)
        assert r.report["config"]["amp"] == r.report["amp"] == ("bf16" if has else None)   # what ran
        assert seen and {d for _, d in seen} == {torch.bfloat16 if has else torch.float32}, method


def test_cpu_presets_use_auto_and_the_others_none():
    for name, s in SETTINGS.items():
        for v in s.variants:
            want = "auto" if (name, v.name) in CPU_PRESETS else None
            assert v.amp == want, (name, v.name)
            assert s.config(v).amp == want
            assert s.config(v, amp=None).amp is None        # the caller's choice wins
            for m in ("ft", "scrub", "ssd"):
                cfg = method_config(m, setting=name, variant=v.name)
                assert (cfg.amp if cfg is not None else None) == want, (name, v.name, m)
            rt = method_config("retrain", setting=name, variant=v.name)
            assert rt.amp == want and rt.recipe == v.recipe
    assert ee.UnlearnConfig.preset("cifar100").amp is None   # the paper / reference presets: float32


@pytest.mark.parametrize("has", [True, False])
def test_prepare_resolves_the_recipes_auto_for_the_device(tmp_path, monkeypatch, has):
    pytest.importorskip("sklearn")
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: has)
    p = prepare("digits", "reduced", train={"amp": "auto", "epochs": 1}, cache_dir=tmp_path, progress=False)
    assert p.recipe.amp == ("bf16" if has else None) and p.key["recipe"]["amp"] == p.recipe.amp
    off = prepare("digits", "reduced", train={"amp": None, "epochs": 1}, progress=False)
    assert off.recipe.amp is None


def test_auto_leaves_a_float64_model_alone_and_works_in_the_public_functions(small, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: True)
    r = ee.unlearn(mlp().double(), small, tiny_config(amp="auto"), progress=False)
    assert r.report["amp"] is None                      # autocast does not lower float64
    assert resolve_amp("auto", "cpu", torch.float16) is None
    cfg = tiny_config()
    ee.stage2(mlp(), small, cfg.stage2, amp="auto", progress=False)
    ee.stage1(mlp(), small, cfg.stage1, amp="auto", progress=False)
    ev = ee.evaluate(mlp(), small, amp="auto")
    assert 0.0 <= ev["forget"]["acc"] <= 1.0


def test_auto_is_checkpointed_as_what_ran_and_every_probe_autocasts(small, monkeypatch, tmp_path):
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: True)
    seen = []
    net = mlp()
    net[0].register_forward_hook(lambda m, i, o: seen.append(torch.is_autocast_enabled("cpu")))
    cfg = tiny_config(amp="auto", eval_every=2, checkpoint_every=2)
    ee.unlearn(net, small, cfg, out_dir=tmp_path, progress=False)
    assert seen and all(seen)                         # the original's curve record included
    from entangle_ext.unlearn.checkpoint import load_checkpoint
    assert load_checkpoint(tmp_path / "checkpoints" / "latest.pt")["config"]["amp"] == "bf16"
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: False)   # "another machine"
    with pytest.raises(ValueError, match="amp: 'bf16' in the checkpoint vs None now.*amp=none"):
        ee.unlearn(mlp(), small, cfg, resume=tmp_path / "checkpoints" / "stage1_step000002.pt", progress=False)


def test_compare_cli_amp_flag_sets_every_methods_amp(tmp_path):
    from entangle_ext.cli import compare as cli_compare
    from entangle_ext.compare_jobs import worker_command
    names = ["retrain", "ft", "ssd", "two_stage", "no_w2"]
    args = cli_compare.build_parser().parse_args(["--setting", "cifar100", "--variant", "cpu", "--amp", "none"])
    cfgs = cli_compare.amp_configs(names, args, "cpu")
    assert set(cfgs) == set(names) and all(c.amp is None for c in cfgs.values())
    assert isinstance(cfgs["two_stage"], ee.UnlearnConfig) and cfgs["retrain"].recipe == get_setting(
        "cifar100").variant("cpu").recipe
    args.out_dir = str(tmp_path)
    cmd = worker_command(args, "cpu", names, 1, tmp_path)
    assert cmd[cmd.index("--amp") + 1] == "none"
    preset = cli_compare.build_parser().parse_args(["--setting", "cifar100", "--variant", "cpu"])
    assert cli_compare.amp_configs(names, preset, "cpu") is None
    assert "--amp" not in worker_command(_with_out(preset, tmp_path), "cpu", names, 1, tmp_path)
    with pytest.raises(SystemExit):
        cli_compare.build_parser().parse_args(["--setting", "cifar100", "--amp", "fp16"])


def _with_out(args, out):
    """``args`` with the out_dir a worker command reads."""
    args.out_dir = str(out)
    return args


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("method", ["two_stage", "ga"])
def test_bf16_on_a_model_that_is_not_float32_reports_what_ran(small, dtype, method):
    """Only a float32 model is autocast: ``amp="bf16"`` on a float64 / bfloat16 model runs no
    autocast, and the report and its config say None (was: "bf16")."""
    seen = []
    net = mlp().to(dtype)
    net[0].register_forward_hook(lambda m, i, o: seen.append(torch.is_autocast_enabled("cpu")))
    cfg = tiny_config(amp="bf16") if method == "two_stage" else \
        get_method(method).config_for("digits", amp="bf16", epochs=1)
    r = ee.unlearn(net, small, cfg, method=method, progress=False)
    assert seen and not any(seen)
    assert r.report["amp"] is None and r.report["config"]["amp"] is None
    assert resolve_amp("bf16", "cpu", dtype) is None and resolve_amp("bf16", "cpu", torch.float32) == "bf16"
