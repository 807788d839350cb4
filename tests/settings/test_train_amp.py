"""Issue 22 item 1 (part): the original-model training takes ``TrainRecipe.amp="bf16"`` (forward
under bfloat16 autocast, float32 loss, weights and optimizer state), and the CPU's bfloat16 matrix
support is detectable. No preset uses it yet (that needs side-by-side runs)."""
import pytest
import torch
from torch.utils.data import TensorDataset

from entangle_ext.train import TrainRecipe, train_original
from entangle_ext.unlearn.precision import cpu_has_bf16_matmul


def _data(n=64, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


def test_amp_is_validated_and_part_of_the_recipe():
    with pytest.raises(ValueError, match="TrainRecipe.amp must be None or one of"):
        TrainRecipe(amp="fp8")
    assert TrainRecipe().to_dict()["amp"] is None    # part of the original-model cache key
    assert TrainRecipe(amp="bf16").to_dict()["amp"] == "bf16"


def test_bf16_training_autocasts_the_forward_and_keeps_float32_state():
    seen = []
    net = _net()
    net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype) if torch.is_grad_enabled() else None)
    train_original(net, [_data()], TrainRecipe("adam", lr=3e-2, epochs=20, batch_size=16, amp="bf16"),
                   device="cpu", progress=False)
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in net.parameters())
    ref = train_original(_net(), [_data()], TrainRecipe("adam", lr=3e-2, epochs=20, batch_size=16),
                         device="cpu", progress=False)
    x, y = _data(seed=1).tensors
    acc = [(m(x).argmax(1) == y).float().mean().item() for m in (net, ref)]
    assert acc[0] > 0.8 and abs(acc[0] - acc[1]) < 0.1, acc      # learns as well as float32
    assert not all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))   # it did autocast


def test_off_the_forward_runs_in_the_parameters_dtype():
    seen = []
    net = _net().double()
    net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    x, y = _data().tensors
    train_original(net, [TensorDataset(x.double(), y)], TrainRecipe("adam", epochs=1, batch_size=16),
                   device="cpu", progress=False)
    assert set(seen) == {torch.float64}


def test_cpu_bf16_matmul_detection_agrees_with_torch():
    has = cpu_has_bf16_matmul()
    assert isinstance(has, bool)
    queries = [getattr(torch.cpu, n, lambda: False)() for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    assert has == (torch.backends.mkldnn.is_available() and any(queries))
