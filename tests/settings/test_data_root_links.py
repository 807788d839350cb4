"""A broken symbolic link where the data lookup (`entangle_ext.data.find_data_file`) looks for a
data file (``cifar100.npz`` pointing nowhere) was reported only as "no CIFAR-100 found": the
message now names the link and its missing target."""
import pytest

from entangle_ext.data import root as root_mod


def test_not_found_names_a_broken_link_at_a_candidate_path(monkeypatch, tmp_path):
    from entangle_ext.data.cifar100 import load_cifar100
    d = tmp_path / "data"
    d.mkdir()
    (d / "cifar100.npz").symlink_to(tmp_path / "moved" / "cifar100.npz")
    with pytest.raises(FileNotFoundError, match="no CIFAR-100 found") as e:      # explicit data directory
        load_cifar100(d)
    msg = str(e.value)
    assert f"broken symbolic link(s): {d / 'cifar100.npz'} -> {tmp_path / 'moved' / 'cifar100.npz'}" in msg, msg
    (tmp_path / "my.npz").symlink_to(tmp_path / "gone.npz")                     # the data path itself
    with pytest.raises(FileNotFoundError, match=r"broken symbolic link\(s\): .*my.npz -> .*gone.npz"):
        load_cifar100(tmp_path / "my.npz")
    monkeypatch.setenv("ENTANGLE_DATA", str(d))                                 # the default places
    monkeypatch.delenv("ENTANGLE_SHARED_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(root_mod, "checkout_data_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"set ENTANGLE_DATA; broken symbolic link\(s\): .*cifar100.npz"):
        root_mod.find_data_file(("cifar-100-python", "cifar100.npz"), what="CIFAR-100")


def test_not_found_without_links_is_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        root_mod.find_data_file("x.npz", tmp_path)
    assert "symbolic" not in str(e.value)
