"""Items torch's default_collate cannot batch (variable-length sequences, images of several
sizes, objects it does not know) without a collate function of one's own: a ValueError naming the
split and saying to pass ``Splits(collate_fn=...)``. It was torch's bare RuntimeError ("stack
expects each tensor to be equal size") from deep inside the run's first pass."""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import entangle_ext as ee
from entangle_ext.unlearn.source import as_source, batch_items, indexed_tensors

from _tiny import tiny_config


class Ragged(Dataset):
    """Token sequences of lengths 1..5, labels 0/1."""

    def __init__(self, n, offset=0):
        self.items = [(torch.randint(1, 10, (1 + (i + offset) % 5,)), i % 2) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class Bag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.EmbeddingBag(10, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.emb(x))


def _pad(items):
    xs, ys = zip(*items)
    return torch.nn.utils.rnn.pad_sequence(xs, batch_first=True), torch.tensor(ys)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_ragged_items_without_a_collate_function_name_the_split_and_the_fix(num_workers):
    splits = ee.Splits(forget=Ragged(16), adjacent=Ragged(16, 1), remote=Ragged(24, 2), num_workers=num_workers)
    with pytest.raises(ValueError, match=r"(?s)split 'forget'.*default_collate cannot batch these items "
                                         r"\(stack expects each tensor to be equal size.*Splits\(collate_fn=\.\.\.\)"):
        ee.unlearn(Bag(), splits, tiny_config(), progress=False)
    padded = ee.Splits(forget=Ragged(16), adjacent=Ragged(16, 1), remote=Ragged(24, 2), collate_fn=_pad)
    ee.unlearn(Bag(), padded, tiny_config(), progress=False)   # with one: runs


def test_a_loader_with_torchs_default_collate_gets_the_same_error():
    loader = DataLoader(Ragged(8), batch_size=4)
    with pytest.raises(ValueError, match="Splits\\(collate_fn=...\\)"):
        as_source(loader).collate_fn([loader.dataset[0], loader.dataset[1]])


def test_objects_default_collate_does_not_know_are_a_value_error():
    with pytest.raises(ValueError, match="default_collate cannot batch these items .*found <class 'object'>"):
        batch_items([(object(), 0), (object(), 1)], "split 'remote'")


def test_batch_items_is_default_collate_on_what_it_can_batch():
    items = [(torch.randn(3), 1), (torch.randn(3), 0)]
    for got, want in zip(batch_items(items), default_collate(items)):
        assert torch.equal(got, want)
    tds = torch.utils.data.TensorDataset(torch.randn(4, 3), torch.arange(4))
    assert indexed_tensors(as_source(tds)) is not None                         # still batched by indexing
    assert indexed_tensors(as_source(tds, collate_fn=default_collate)) is not None
    assert indexed_tensors(as_source(DataLoader(tds, batch_size=2))) is not None
