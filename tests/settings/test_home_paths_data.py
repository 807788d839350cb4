"""A leading ``~`` in the path arguments of the split files, `prepare` and the data loaders is the
home directory (`entangle_ext._paths.expand_user`), as it already was for ``data_root``: nothing
is written to or looked for in a folder named ``~`` under the working directory."""
import numpy as np
import pytest
import torch

from entangle_ext.splits import IndexSplit, load_split, save_split

pytestmark = pytest.mark.usefixtures("one_thread")


def test_save_and_load_split_expand_the_home_directory(home):
    s = IndexSplit([0], [1], [2])
    save_split("~/splits/s.json", s)        # made ./~/splits/s.json
    assert (home / "splits" / "s.json").is_file()
    assert load_split("~/splits/s.json") == s


@pytest.mark.filterwarnings("ignore::UserWarning")   # batch larger than the capped split
def test_prepare_expands_original_and_cache_dir(home):
    pytest.importorskip("sklearn")
    from entangle_ext.settings import prepare
    with pytest.raises(FileNotFoundError, match=f"original model file {home / 'm.pt'} not found"):
        prepare("digits", "reduced", original="~/m.pt", progress=False)
    run = prepare("digits", "reduced", cache_dir="~/cache", progress=False,
                  data={"max_train_per_class": 5}, train={"epochs": 1})
    assert run.cache is not None and str(run.cache).startswith(str(home / "cache")) and run.cache.is_file()
    again = prepare("digits", "reduced", original="~/cache/" + run.cache.name, progress=False,
                    data={"max_train_per_class": 5})
    assert all(torch.equal(a, b) for a, b in zip(run.model.state_dict().values(), again.model.state_dict().values()))


def test_data_readers_expand_the_home_directory(home):
    from entangle_ext.data.root import data_dirs, read_npz
    from entangle_ext.data.tinyimagenet import load_wordnet_csv
    np.savez(home / "a.npz", x=np.arange(3))
    assert read_npz("~/a.npz", ["x"], "test")["x"].tolist() == [0, 1, 2]
    assert data_dirs("~/d") == [("argument", home / "d")]
    with pytest.raises(FileNotFoundError, match=str(home / "w.csv")):
        load_wordnet_csv("~/w.csv")
    from entangle_ext.data.hf_text import hf_model_dir
    with pytest.raises(FileNotFoundError, match=f"{home / 'model'} is not a Hugging Face model directory"):
        hf_model_dir("~/model")
