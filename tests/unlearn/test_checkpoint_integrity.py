"""Damaged files the package wrote itself are refused before anything is loaded: a run checkpoint
(``resume=``), the ``latest.pt`` pointer and a cached original model, with 16 bytes altered inside
a record (torch writes CRC-32s into its zip files but does not check them on load)."""
import copy
import dataclasses
import shutil
import struct
import zipfile

import pytest
import torch

import entangle_ext as ee
from entangle_ext import settings as settings_mod
from entangle_ext.train import TrainRecipe, load_model_file, train_original
from entangle_ext.unlearn import load_checkpoint

from _tiny import mlp, tiny_config

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

PREFIX = "is not a readable torch file (state dict or entangle_ext checkpoint): "
DAMAGED = "the file is damaged"


def _data_offset(raw: bytes, info: zipfile.ZipInfo) -> int:
    """Where a member's stored bytes begin: after its local header (30 bytes + name + extra)."""
    h = info.header_offset
    assert raw[h:h + 4] == b"PK\x03\x04"
    name_len, extra_len = struct.unpack("<HH", raw[h + 26:h + 30])
    return h + 30 + name_len + extra_len


def _damage(path, member="largest", n=16):
    """XOR ``n`` bytes in the middle of a member's data: the largest tensor record
    (``<archive>/data/<k>``) or the one whose name ends with ``member`` (e.g. "data.pkl")."""
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
    if member == "largest":
        recs = [i for i in infos if "/data/" in i.filename]
        info = max(recs, key=lambda i: i.file_size)
    else:
        info = next(i for i in infos if i.filename.endswith(member))
    assert info.compress_type == zipfile.ZIP_STORED and info.file_size >= n
    raw = bytearray(path.read_bytes())
    start = _data_offset(raw, info) + (info.file_size - n) // 2
    for k in range(start, start + n):
        raw[k] ^= 0xFF
    path.write_bytes(bytes(raw))
    return info.filename


def _snapshot(model):
    return copy.deepcopy(model.state_dict())


def _unchanged(model, before):
    sd = model.state_dict()
    return sd.keys() == before.keys() and all(torch.equal(sd[k], before[k]) for k in sd)


def _assert_damaged_message(e, path):
    msg = str(e.value)
    assert msg.startswith(f"{path} {PREFIX}{DAMAGED}"), msg
    assert "\n" not in msg and "earlier checkpoint" in msg and "delete" in msg, msg


# ------------------------------------------------------------------------------ run checkpoints
@pytest.fixture(scope="module")
def run_dir(small, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=2)
    ee.unlearn(mlp(), small, cfg, out_dir=out, progress=False)
    return out


def test_torch_itself_loads_the_damaged_checkpoint(run_dir, tmp_path):
    """The premise: 16 altered bytes in a weight record go unnoticed by torch.load."""
    f = tmp_path / "c.pt"
    shutil.copy(run_dir / "checkpoints" / "stage1_step000004.pt", f)
    good = torch.load(f, weights_only=False)
    _damage(f)
    bad = torch.load(f, weights_only=False)
    assert any(not torch.equal(a, b) for a, b in zip(good["model"].values(), bad["model"].values()))


@pytest.mark.parametrize("member", ["largest", "data.pkl"])
def test_resume_from_a_damaged_checkpoint_is_refused_before_the_model_is_touched(small, run_dir, tmp_path,
                                                                                 member):
    f = tmp_path / "stage1_step000004.pt"
    shutil.copy(run_dir / "checkpoints" / f.name, f)
    _damage(f, member)
    model = mlp(seed=9)
    before = _snapshot(model)
    with pytest.raises(ValueError, match=DAMAGED) as e:
        ee.unlearn(model, small, resume=f, out_dir=tmp_path / "out", progress=False)
    _assert_damaged_message(e, f)
    assert _unchanged(model, before)
    with pytest.raises(ValueError, match=DAMAGED):
        load_checkpoint(f)


def test_resume_from_an_out_dir_whose_latest_checkpoint_is_damaged(small, run_dir, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    latest = out / "checkpoints" / "stage2_done.pt"
    assert load_checkpoint(out)["tag"] == "stage2_done"
    _damage(latest)
    model = mlp(seed=9)
    before = _snapshot(model)
    with pytest.raises(ValueError, match=DAMAGED) as e:
        ee.unlearn(model, small, resume=out, out_dir=out, progress=False)
    _assert_damaged_message(e, latest)
    assert _unchanged(model, before)


def test_a_damaged_latest_pointer_is_refused(run_dir, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    pointer = out / "checkpoints" / "latest.pt"
    _damage(pointer, "data.pkl", n=4)
    with pytest.raises(ValueError, match=DAMAGED) as e:
        load_checkpoint(out)
    _assert_damaged_message(e, pointer)


# ------------------------------------------------------------------------------ cached original model
def test_a_damaged_cached_original_model_is_refused(small, tmp_path):
    cache = tmp_path / "original.pt"
    recipe = TrainRecipe(epochs=1, batch_size=64)
    train_original(mlp(), [small.forget, small.adjacent], recipe, device="cpu", cache=cache, progress=False)
    _damage(cache)
    assert len(torch.load(cache, weights_only=True)) == 4          # torch alone reads it
    for load in (lambda m: load_model_file(m, cache),
                 lambda m: train_original(m, [small.forget, small.adjacent], recipe, device="cpu", cache=cache,
                                          progress=False)):
        model = mlp(seed=5)
        before = _snapshot(model)
        with pytest.raises(ValueError, match=DAMAGED) as e:
            load(model)
        _assert_damaged_message(e, cache)
        assert _unchanged(model, before)


def test_prepare_refuses_a_damaged_cache_file(tmp_path):
    pytest.importorskip("sklearn")
    kw = dict(data={"max_train_per_class": 10}, train={"epochs": 1}, progress=False, cache_dir=tmp_path)
    settings_mod.prepare("digits", **kw)
    (cache,) = tmp_path.glob("original_digits_*.pt")
    _damage(cache)
    with pytest.raises(ValueError, match=DAMAGED) as e:
        settings_mod.prepare("digits", **kw)
    _assert_damaged_message(e, cache)
