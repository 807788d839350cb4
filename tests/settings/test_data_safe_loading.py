"""No data file runs code when read (issue 24 item 6): the CIFAR-100 ``cifar-100-python/`` pickles
go through a restricted unpickler (numpy array reconstruction only, no object arrays), and the
package's other readers keep ``torch.load(weights_only=True)`` / ``np.load(allow_pickle=False)``.
All data here is tiny and synthetic (tmp_path)."""
import ast
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from _support import REPO_ROOT

ROOT = REPO_ROOT
FINE = [b"aquarium_fish", b"trout", b"rose", b"tulip"]
COARSE = [b"fish", b"flowers"]


class _Py2Pickler(pickle._Pickler):
    """Writes pickles as Python 2's cPickle wrote the original CIFAR-100 files (protocol 2): str
    and bytes as (SHORT_)BINSTRING, read back as bytes with encoding="bytes"."""
    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        b = obj if isinstance(obj, bytes) else obj.encode("latin1")
        if len(b) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(b)]) + b)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(b)) + b)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str
    dispatch[str] = _save_py2_str


def _py2_dumps(obj) -> bytes:
    import io
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    # the originals name numpy 1's module (numpy 2 writes numpy._core.multiarray)
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n_reconstruct\n", b"cnumpy.core.multiarray\n_reconstruct\n")


def _split(n_per_fine, seed):
    rng = np.random.default_rng(seed)
    fine = np.repeat(np.arange(len(FINE)), n_per_fine)
    data = rng.integers(0, 256, (len(fine), 3072), dtype=np.uint8)
    return {b"filenames": [b"img_%d.png" % i for i in range(len(fine))], b"batch_label": b"training batch 1 of 1",
            b"fine_labels": [int(f) for f in fine], b"coarse_labels": [int(f) // 2 for f in fine], b"data": data}


def _write_cifar(root: Path, dumps, train=None):
    d = root / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    splits = {"train": _split(2, 0) if train is None else train, "test": _split(1, 1)}
    for name, obj in splits.items():
        (d / name).write_bytes(dumps(obj))
    (d / "meta").write_bytes(dumps({b"fine_label_names": FINE, b"coarse_label_names": COARSE}))
    return splits


class _RunsSystem:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class _RunsExec:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.mark.parametrize("payload, glob", [(_RunsSystem, f"{os.system.__module__}.system"),
                                           (_RunsExec, "__builtin__.exec")])   # protocol 2 names Python 2 modules
def test_crafted_cifar_pickle_runs_no_code(tmp_path, payload, glob):
    from entangle_ext.data.cifar100 import load_cifar100
    marker = tmp_path / "marker"
    d = tmp_path / "cifar-100-python"
    _write_cifar(tmp_path, lambda o: pickle.dumps(o, protocol=2))
    (d / "train").write_bytes(pickle.dumps({b"data": payload(marker)}, protocol=2))
    with pytest.raises(ValueError) as e:
        load_cifar100(tmp_path)
    msg = str(e.value)
    assert str(d / "train") in msg and f"refuses to load the pickled global {glob}" in msg, msg
    assert not marker.exists()


@pytest.mark.parametrize("dumps", [_py2_dumps, lambda o: pickle.dumps(o, protocol=2)],
                         ids=["python2-original", "python3-protocol2"])
def test_genuine_format_cifar_pickles_load(tmp_path, dumps):
    from entangle_ext.data.cifar100 import cifar100_splits, load_cifar100
    want = _write_cifar(tmp_path, dumps)
    if dumps is _py2_dumps:   # the file really has the originals' layout: numpy 1 names, no _codecs
        raw = (tmp_path / "cifar-100-python" / "train").read_bytes()
        assert b"numpy.core.multiarray" in raw and b"_codecs" not in raw
    d = load_cifar100(tmp_path)
    for split in ("train", "test"):
        w = want[split]
        x = d[f"x_{split}"]
        assert x.dtype == np.uint8 and x.shape == (len(w[b"fine_labels"]), 32, 32, 3)
        np.testing.assert_array_equal(x, w[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        assert d[f"y_{split}_fine"].dtype == np.int64 and d[f"y_{split}_fine"].tolist() == w[b"fine_labels"]
        assert d[f"y_{split}_coarse"].tolist() == w[b"coarse_labels"]
    assert d["fine_names"] == [s.decode() for s in FINE] and d["coarse_names"] == ["fish", "flowers"]
    s, info = cifar100_splits(tmp_path)
    assert info["num_classes"] == 2 and len(s.forget) == 2


class _NdarrayCall:
    def __reduce__(self):   # numpy.ndarray called directly, not through _reconstruct
        return np.ndarray, ((4, 3072), "O")


@pytest.mark.parametrize("train", [
    {b"data": np.zeros((4, 3072), np.uint8).astype(object), b"fine_labels": [0, 0, 1, 1], b"coarse_labels": [0] * 4},
    {b"data": np.zeros((4, 3072), np.uint8), b"fine_labels": [0, 0, 1, 1], b"coarse_labels": [0] * 4,
     b"filenames": [np.array([1, "a"], dtype=object)]},
    {b"data": np.zeros((4, 3072), [("a", np.uint8), ("b", object)]), b"fine_labels": [0] * 4,
     b"coarse_labels": [0] * 4},
    {b"data": _NdarrayCall(), b"fine_labels": [0, 0, 1, 1], b"coarse_labels": [0] * 4},
], ids=["object-data", "nested-object-array", "object-field", "ndarray-call"])
def test_object_arrays_are_refused(tmp_path, train):
    from entangle_ext.data.cifar100 import load_cifar100
    _write_cifar(tmp_path, lambda o: pickle.dumps(o, protocol=2), train=train)
    with pytest.raises(ValueError) as e:
        load_cifar100(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "cifar-100-python" / "train") in msg, msg
    if not isinstance(train[b"data"], _NdarrayCall):
        assert "refuses to load an object-dtype numpy array" in msg, msg


_SOURCE_DIRS = ("entangle_ext", "python_examples", "bench", "scripts")
_PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib"}


def _kw(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _unsafe_loads(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if isinstance(b, ast.Attribute) and b.attr == "Unpickler" and not (
                        path.name == "cifar100_pickle.py" and node.name == "_CifarUnpickler"):
                    yield node.lineno, f"class {node.name}({ast.unparse(b)})"
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)):
            continue
        mod, attr, text = node.func.value.id, node.func.attr, ast.unparse(node)
        if mod == "torch" and attr == "load":
            v = _kw(node, "weights_only")
            if not (isinstance(v, ast.Constant) and v.value is True):
                yield node.lineno, text
        elif mod in ("np", "numpy") and attr == "load":
            v = _kw(node, "allow_pickle")
            if not (isinstance(v, ast.Constant) and v.value is False):
                yield node.lineno, text
        elif (mod in _PICKLE_MODULES and attr in ("load", "loads", "Unpickler")) or attr == "read_pickle":
            yield node.lineno, text


def test_no_reader_in_the_package_unpickles_freely():
    files = [p for d in _SOURCE_DIRS if (ROOT / d).is_dir() for p in sorted((ROOT / d).rglob("*.py"))]
    assert any(p.name == "cifar100_pickle.py" for p in files)
    bad = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in files for line, text in _unsafe_loads(p)]
    assert not bad, "loads that may run code from a file (torch.load needs weights_only=True, np.load " \
                    "allow_pickle=False, pickles the restricted unpickler):\n" + "\n".join(bad)
