"""Issue 22 item 3: the original-model training (and Retrain's) passes image batches to the model
in channels-last memory format where a run would (`TrainRecipe.channels_last`, default "auto"),
and `entangle_ext.settings.prepare` keys the cache on what ran."""
import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from _support import SHARED_DATA
from entangle_ext.methods.retrain import RetrainConfig
from entangle_ext.settings import prepare
from entangle_ext.train import TrainRecipe, train_original



class _Conv(torch.nn.Module):
    """A small conv net that records, for every forward pass under autograd, whether its input
    was channels-last (``seen``)."""

    def __init__(self, flat_view=False):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8 * 6 * 6 if flat_view else 8, 3)
        self.flat_view = flat_view
        self.seen = []

    def forward(self, x):
        if torch.is_grad_enabled():
            self.seen.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        h = torch.relu(self.bn(self.conv(x)))
        if self.flat_view:   # .view of a channels-last activation raises
            return self.head(h.view(h.shape[0], -1))
        return self.head(h.mean((2, 3)))


def _images(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 6, 6, generator=g)
    return TensorDataset(x, (x[:, 0].mean((1, 2)) > 0).long())


def _recipe(**kw):
    return TrainRecipe("sgd", lr=0.05, epochs=2, batch_size=8, **kw)


def test_channels_last_is_validated_and_part_of_the_recipe():
    assert TrainRecipe().channels_last == "auto" and TrainRecipe().to_dict()["channels_last"] == "auto"
    for bad in ("yes", 1, None, "Auto"):
        with pytest.raises(ValueError, match="TrainRecipe.channels_last must be one of"):
            TrainRecipe(channels_last=bad)
    assert TrainRecipe(channels_last=False).to_dict()["channels_last"] is False


@pytest.mark.parametrize("setting, want", [("auto", True), (True, True), (False, False)])
def test_training_passes_channels_last_batches_as_set(setting, want):
    net = _Conv()
    train_original(net, [_images()], _recipe(channels_last=setting), device="cpu", progress=False)
    assert len(net.seen) == 2 * 3 and set(net.seen) == {want}     # every training forward pass
    assert all(p.is_contiguous() for p in net.parameters())      # the parameters keep their layout


def test_channels_last_training_matches_contiguous_training_to_round_off():
    a, b = _Conv(), _Conv()
    train_original(a, [_images()], _recipe(), device="cpu", progress=False)
    train_original(b, [_images()], _recipe(channels_last=False), device="cpu", progress=False)
    assert set(a.seen) == {True} and set(b.seen) == {False}
    for p, q in zip(a.state_dict().values(), b.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_a_model_that_breaks_on_channels_last_falls_back_or_raises():
    net = _Conv(flat_view=True)
    train_original(net, [_images()], _recipe(), device="cpu", progress=False)   # auto: contiguous
    assert net.seen and set(net.seen) == {False}
    with pytest.raises(ValueError, match=r"channels_last=True: the model \(_Conv\) fails"):
        train_original(_Conv(flat_view=True), [_images()], _recipe(channels_last=True), device="cpu",
                       progress=False)


def test_non_image_inputs_train_as_before():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    x = torch.randn(16, 4)
    train_original(net, [TensorDataset(x, (x[:, 0] > 0).long())], _recipe(channels_last=True), device="cpu",
                   progress=False)   # True on 2-D inputs: nothing to convert, no error


def test_retrain_trains_under_the_runs_channels_last():
    splits = ee.Splits(forget=_images(8, 1), adjacent=_images(16, 2), remote=_images(16, 3))
    for run_setting, recipe_setting, want in (("auto", "auto", True), (False, "auto", False),
                                              ("auto", True, True),     # a resolved recipe that agrees
                                              ("auto", False, False),   # the recipe's bool sets the run's
                                              (False, False, False)):
        net = _Conv()
        report = ee.unlearn(net, splits, RetrainConfig(recipe=_recipe(channels_last=recipe_setting),
                                                       channels_last=run_setting),
                            method="retrain", progress=False).report
        assert report["channels_last"] is want
        assert net.seen and set(net.seen) == {want}, (run_setting, recipe_setting)


@pytest.mark.parametrize("recipe_setting", [True, False])
def test_a_bare_recipe_trains_retrain_as_it_says(recipe_setting):
    """A bare `TrainRecipe` (e.g. `prepare`'s resolved one) as Retrain's config: its channels_last
    is the run's, not refused once the run has started."""
    splits = ee.Splits(forget=_images(8, 1), adjacent=_images(16, 2), remote=_images(16, 3))
    net = _Conv()
    report = ee.unlearn(net, splits, _recipe(channels_last=recipe_setting), method="retrain", progress=False).report
    assert report["channels_last"] is recipe_setting and set(net.seen) == {recipe_setting}


def test_a_disagreeing_recipe_is_refused_at_construction():
    for run_setting, recipe_setting in ((True, False), (False, True)):
        with pytest.raises(ValueError, match=rf"RetrainConfig.recipe.channels_last={recipe_setting} disagrees "
                                             rf"with RetrainConfig.channels_last={run_setting}"):
            RetrainConfig(recipe=_recipe(channels_last=recipe_setting), channels_last=run_setting)
    cfg = RetrainConfig(recipe=_recipe(channels_last=False))
    assert cfg.channels_last is False
    with pytest.raises(ValueError, match="disagrees"):
        cfg.replace(channels_last=True)
    assert RetrainConfig.from_dict(cfg.to_dict()) == cfg


def test_prepare_keys_the_cache_on_what_ran(tmp_path):
    pytest.importorskip("sklearn")
    p = prepare("digits", "reduced", train={"epochs": 1}, cache_dir=tmp_path, progress=False)
    assert p.recipe.channels_last is False and p.key["recipe"]["channels_last"] is False   # an MLP


@pytest.mark.skipif(not (SHARED_DATA / "cifar100.npz").is_file(), reason="shared cifar100.npz not present")
def test_prepare_resolves_channels_last_for_the_cifar100_cpu_model(tmp_path):
    pytest.importorskip("torchvision")
    on = prepare("cifar100", "cpu", train={"epochs": 0}, cache_dir=tmp_path, progress=False)
    off = prepare("cifar100", "cpu", train={"epochs": 0, "channels_last": False}, cache_dir=tmp_path,
                  progress=False)
    assert on.recipe.channels_last is True and on.key["recipe"]["channels_last"] is True
    assert off.recipe.channels_last is False and off.cache != on.cache   # another model: another file


class _RandomItems(torch.utils.data.Dataset):
    """A map-style dataset whose items draw from torch's global generator (a random transform)."""

    def __init__(self, n=24):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.arange(n) % 2

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.rand(4), self.y[i]


@pytest.mark.parametrize("setting", ["auto", True])
def test_the_probe_draws_no_random_number_the_training_would_see(setting):
    def trained(cl):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
        train_original(net, [_RandomItems()], _recipe(channels_last=cl), device="cpu", progress=False)
        return net.state_dict()
    a, b = trained(setting), trained(False)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_retrain_checkpoint_from_before_the_field_resumes():
    from entangle_ext.unlearn.checkpoint import check_resume_config
    now = RetrainConfig(recipe=_recipe()).to_dict()
    old = {**now, "recipe": {k: v for k, v in now["recipe"].items() if k not in ("channels_last", "amp")}}
    assert check_resume_config({"config": old}, now) == {}
    with pytest.raises(ValueError, match="recipe.channels_last"):
        check_resume_config({"config": {**now, "recipe": {**now["recipe"], "channels_last": False}}}, now)
