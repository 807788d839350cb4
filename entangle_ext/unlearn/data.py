"""Data plumbing of every run: `Splits`, deterministic resumable batch streams, model calls.

A split is a map-style Dataset or a `torch.utils.data.DataLoader` (its dataset, ``collate_fn``,
``num_workers``, ``pin_memory``, ``worker_init_fn`` and ``multiprocessing_context`` are used; its
batch size and order are not: every stage draws its own batch sizes and seeded orders). A
DataLoader's items are its whole dataset under torch's default samplers (``shuffle=False`` /
``True``) and the indices of a `SubsetRandomSampler`; any other sampler is refused
(`loader_dataset`). A Dataset
item is an ``(x, y)`` tuple (``y`` an integer class index) or a dict with a ``"labels"`` (or
Hugging Face ``"label"``) entry plus model keyword inputs (e.g. ``input_ids``, ``attention_mask``).
Datasets exposing ``.tensors`` (e.g. `torch.utils.data.TensorDataset`, possibly already on the GPU)
are batched by direct tensor indexing, without per-sample collation or workers, unless a collate
function of one's own is given (``Splits(collate_fn=...)`` or the DataLoader's): then it builds
their batches too, from the ``(x, y)`` items, as for any Dataset (`indexed_tensors`).

Where a batch is made (`prepare_batch`), its labels are checked (integer dtype, shape (batch,)) and
cast to int64, and its floating inputs are cast to the model's dtype.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import hashlib
import itertools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, TensorDataset

from .batch import (LABEL_DTYPES, batch_size_of, cast_floating, concat_batches, forward_logits,  # noqa: F401
                    loss_logits, move_batch, prepare_batch, require_graph, slice_batch, sliceable, split_batch)  # (re-exported)
from .disjoint import check_disjoint, check_held_out
from .distributed import Dist, current
from .scopes import joined_scope
from .source import (Source, as_source, check_batch_size, check_loader_options, indexed_tensors,  # noqa: F401
                     named_collate, union_source)  # (re-exported)

__all__ = ["Splits", "Source", "BatchStream", "BatchLargerThanSplitWarning", "batch_warning_scope", "forward_logits", "loss_logits", "move_batch", "batch_size_of",
           "concat_batches", "split_batch", "prepare_batch", "LABEL_DTYPES", "as_source", "union_source",
           "check_batch_size", "check_loader_options", "has_batchnorm", "require_graph"]



@dataclass
class Splits:
    """The three disjoint training sets (docs/algorithm.md §1) plus optional held-out parts.

    Attributes:
        forget: D_f train (the sub-population to forget; keeps its coarse label).
        adjacent: D_adj train (sibling sub-populations of the same coarse class); only Stage 2 and
            the evaluation use it, so a Stage-1-only run (``run_stage2=False``) may leave it None.
        remote: D_rem train (everything else).
        forget_test, adjacent_test, remote_test: optional held-out parts, evaluation only.
        collate_fn: builds a batch from a list of items for the Dataset splits (e.g. padding
            variable-length token sequences), TensorDatasets included (given one, their batches
            are collated from (x, y) items instead of indexed); default torch's `default_collate`
            (whose refusal of items it cannot batch, e.g. of unequal shapes, is a ValueError). A
            DataLoader split uses its own.
        num_workers: DataLoader worker processes for the Dataset splits (0 = in process).
    Each split is a map-style Dataset or a DataLoader (see the module docstring).

    Raises TypeError / ValueError at construction for a ``collate_fn`` that is not callable or a
    ``num_workers`` that is not an integer >= 0 (`check_loader_options`).
    """
    forget: Any = None
    adjacent: Any = None
    remote: Any = None
    forget_test: Any = None
    adjacent_test: Any = None
    remote_test: Any = None
    collate_fn: Optional[Callable] = None
    num_workers: int = 0

    TRAIN = ("forget", "adjacent", "remote")
    TEST = ("forget_test", "adjacent_test", "remote_test")

    def __post_init__(self):
        check_loader_options(self.collate_fn, self.num_workers)

    def named(self) -> Dict[str, Any]:
        """All present splits by name (train first, then held-out), as given."""
        return {n: getattr(self, n) for n in self.TRAIN + self.TEST if getattr(self, n) is not None}

    def source(self, name: str) -> Source:
        """The `Source` of split ``name``. Raises ValueError when it is absent."""
        d = getattr(self, name)
        if d is None:
            raise ValueError(f"split {name!r} is required here but is None")
        return as_source(d, self.collate_fn, self.num_workers)

    def check(self, required: Iterable[str] = TRAIN, *, by: Optional[str] = None) -> None:
        """Raise ValueError if a ``required`` split is missing (the message names ``by``, e.g.
        ``"method 'ga'"``, when given), or any present split is empty, unsized or iterable-style,
        or (without a ``collate_fn``) not a Dataset of (x, y) items: an array or tensor, a tuple /
        list of arrays (e.g. ``(X, y)``), a TensorDataset of one tensor (`_check_form`);
        then `check_disjoint` of the train splits (ValueError for one object in two splits or
        Subsets sharing indices; `OverlappingSplitsWarning` for identical rows) and
        `check_held_out` (`OverlappingSplitsWarning` for a held-out split that is, or shares
        samples with, a train split)."""
        for n in required:
            if getattr(self, n) is None:
                raise ValueError(f"split {n!r} is required" + (f" by {by}" if by else ""))
        for n, d in self.named().items():
            if self.collate_fn is None:   # (a collate function may build (x, y) batches from anything)
                _check_form(n, d)
            ds = self.source(n).dataset
            try:
                size = len(ds)
            except TypeError as exc:
                raise ValueError(f"split {n!r} must be a sized Dataset") from exc
            if size == 0:
                raise ValueError(f"split {n!r} is empty: every split of Splits needs at least one sample")
        check_disjoint({n: getattr(self, n) for n in self.TRAIN if getattr(self, n) is not None})
        check_held_out({n: getattr(self, n) for n in self.TRAIN if getattr(self, n) is not None},
                       {n: getattr(self, n) for n in self.TEST if getattr(self, n) is not None})


def _check_form(name: str, d: Any) -> None:
    """ValueError, naming split ``name`` and what to pass instead, when ``d`` is one of the
    containers users hand over that are not a Dataset of (x, y) items."""
    fix = "a split is a Dataset (or DataLoader) of (inputs, label) items: wrap the arrays as " \
          "torch.utils.data.TensorDataset(X, y)"

    def kind(v):
        return f"{type(v).__module__.split('.')[0]}.{type(v).__name__}"
    if isinstance(d, torch.Tensor) or kind(d) == "numpy.ndarray":
        raise ValueError(f"split {name!r} is a {'torch.Tensor' if isinstance(d, torch.Tensor) else kind(d)} of "
                         f"shape {tuple(d.shape)}, not a Dataset; {fix}")
    if isinstance(d, (tuple, list)) and d and all(isinstance(v, torch.Tensor) or kind(v) == "numpy.ndarray"
                                                  for v in d):
        pair = " (e.g. (X, y))" if len(d) == 2 else ""
        raise ValueError(f"split {name!r} is a {type(d).__name__} of {len(d)} tensors / arrays{pair}, whose items "
                         f"are not (inputs, label) pairs; {fix}")
    if isinstance(d, TensorDataset) and len(d.tensors) < 2:
        raise ValueError(f"split {name!r} is a TensorDataset of {len(d.tensors)} tensor: its items need inputs "
                         f"and labels; {fix}")


def has_batchnorm(model: Optional[torch.nn.Module]) -> bool:
    """Whether ``model`` holds a BatchNorm layer (``torch.nn.BatchNorm1d/2d/3d``, their lazy forms,
    ``SyncBatchNorm``), whatever its train/eval mode: its training streams fold 1-sample tails
    (`BatchStream`)."""
    return model is not None and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                     for m in model.modules())


def stream_seed(seed: int, stream: str, epoch: int) -> int:
    h = hashlib.sha256(f"{seed}/{stream}/{epoch}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


class _Plan:
    """An iterable of index batches for ``DataLoader(batch_sampler=...)``."""

    def __init__(self, batches: Iterable[List[int]]):
        self.batches = batches

    def __iter__(self):
        return (idx.tolist() for idx in self.batches)


class BatchLargerThanSplitWarning(UserWarning):
    """A training stream's batch size exceeds its split: the batches are cut to the split (fewer,
    smaller steps than the configuration suggests). Inside a `batch_warning_scope` (one `compare`
    call) each distinct message is given once, not once per run."""


#: the messages already given inside the open `batch_warning_scope` (None: no scope open)
_GIVEN: contextvars.ContextVar[Optional[set]] = contextvars.ContextVar("entangle_ext_batch_warnings", default=None)


@contextlib.contextmanager
def batch_warning_scope() -> Iterator[None]:
    """Within this context (one `compare` call, every run of it) each distinct
    `BatchLargerThanSplitWarning` is given once; a scope opened inside another joins it; outside
    one, every stream that meets the case warns."""
    with joined_scope(_GIVEN, set):
        yield


def _warn_once(message: str) -> None:
    given = _GIVEN.get()
    if given is None or message not in given:
        warnings.warn(message, BatchLargerThanSplitWarning, stacklevel=4)
    if given is not None:
        given.add(message)


class BatchStream:
    """Deterministic, resumable minibatch stream over a split (Dataset, DataLoader or `Source`).

    The order of epoch e is a pure function of (seed, name, e) — with ``replay_first=True`` every
    epoch repeats epoch 0's order (a cycled loader) — so a resumed run only needs the counters
    (epoch, position). Batches are moved to ``device`` and prepared by `prepare_batch` (labels to
    int64, floating inputs to ``input_dtype`` when given); the last batch of an epoch may be smaller
    (no drop_last), as with a DataLoader. Datasets without ``.tensors`` are loaded through a
    DataLoader over the stream's own index batches (workers, prefetching).

    One-sample tails: a training stream of a model with BatchNorm never delivers a batch of one
    sample (BatchNorm in train mode cannot normalise it: "Expected more than 1 value per channel
    when training"). With ``fold_tail`` (None, the default: ``training``; the library's training
    streams pass ``training and has_batchnorm(model)``), when ``n % batch_size == 1`` and
    ``n > batch_size`` the 1-sample tail of every epoch is folded into the batch before it (that
    batch has ``batch_size + 1`` samples, e.g. [64, 65] for n = 129): every sample is still used
    once per epoch, ``len(stream)`` is one fewer, and the fold is a function of (n, batch_size)
    alone, so orders, counters and resumes stay deterministic. Models without BatchNorm and
    evaluation streams keep the plain split (a 1-sample last batch, which under several ranks gives
    one rank an empty part). A split of one sample is still one batch of one: its forward passes
    run the model's train-mode BatchNorm layers on their running statistics (`forward_logits`).

    Under several ranks (``dist``, default: the `current` run of ``entangle_ext/unlearn/distributed.py``)
    ``batch_size`` is the global batch: every rank computes the same global order and index
    batches and loads only its contiguous part of each (`Dist.shard`; docs/algorithm.md §11), so
    the ranks' parts of a step are, together, exactly the batch of one process. A part may be
    empty (a batch smaller than the number of ranks): it is then a 0-sample batch of the split's
    structure. ``len(stream)`` counts global batches.
    """

    def __init__(self, data, batch_size: int, *, shuffle: bool, seed: int, name: str, device,
                 input_dtype: Optional[torch.dtype] = None, replay_first: bool = False,
                 dist: Optional[Dist] = None, training: bool = False, fold_tail: Optional[bool] = None):
        self.source = as_source(data)
        self.dataset = self.source.dataset
        #: the dataset's tensors when batches are made by indexing them (`indexed_tensors`), else None
        self.tensors = indexed_tensors(self.source)
        self._collate = named_collate(self.source.collate_fn, f"split {name!r}")
        self.batch_size = check_batch_size(batch_size, f"the batch size of stream {name!r}")
        self.shuffle, self.replay_first = shuffle, replay_first
        self.seed, self.name, self.device, self.input_dtype = seed, name, device, input_dtype
        self.dist = dist if dist is not None else current()
        self.n = len(self.dataset)
        self.training = bool(training)
        #: the 1-sample tail of each epoch is folded into the batch before it (see the docstring)
        fold_tail = self.training if fold_tail is None else bool(fold_tail)
        self.fold = fold_tail and self.n > self.batch_size and self.n % self.batch_size == 1
        if training and 0 < self.n < self.batch_size:
            _warn_once(f"stream {name!r}: batch size {self.batch_size} is larger than its split "
                       f"({self.n} samples): every batch is the whole split, one step per epoch")
        self.epoch, self.pos = 0, 0  # next batch to deliver (cycling use)
        self._feeds: Dict[str, Tuple[Any, Iterator]] = {}
        self._peeked: Optional[Tuple[Tuple[int, int], Any]] = None
        self._last_order: Optional[Tuple[int, torch.Tensor]] = None

    def __len__(self) -> int:
        return (self.n + self.batch_size - 1) // self.batch_size - int(self.fold)

    def split(self, order: torch.Tensor) -> List[torch.Tensor]:
        """``order`` (a permutation of the n indices) cut into this stream's index batches: runs of
        ``batch_size``, the last one smaller, or ``batch_size + 1`` when a 1-sample tail is folded
        (``self.fold``)."""
        parts = list(torch.split(order, self.batch_size))
        if self.fold and len(parts) >= 2 and parts[-1].numel() == 1:
            parts[-2:] = [torch.cat(parts[-2:])]
        return parts

    def order(self, epoch: int) -> torch.Tensor:
        """The sample order of epoch ``epoch`` (the last one asked for is kept)."""
        if not self.shuffle:
            return torch.arange(self.n)
        key = 0 if self.replay_first else epoch
        if self._last_order is None or self._last_order[0] != key:
            g = torch.Generator().manual_seed(stream_seed(self.seed, self.name, key))
            self._last_order = (key, torch.randperm(self.n, generator=g))
        return self._last_order[1]

    def global_batch_indices(self, epoch: int) -> List[torch.Tensor]:
        """The index batches of epoch ``epoch`` (global: the batches of one process)."""
        return self.split(self.order(epoch))

    def batch_indices(self, epoch: int) -> List[torch.Tensor]:
        """This rank's part of each index batch of epoch ``epoch`` (all of it for one process)."""
        return [self.dist.shard(i) for i in self.global_batch_indices(epoch)]

    def pass_indices(self, epoch: int, limit: int) -> List[torch.Tensor]:
        """The global index batches that `fetch_pass` (``epoch``, ``limit``) loads parts of."""
        return self.global_batch_indices(epoch)[:limit]

    def shard_span(self, pos: int) -> Tuple[int, int, int]:
        """(lo, hi, n): this rank's positions [lo, hi) within global batch ``pos`` of an epoch,
        and that batch's size n (host arithmetic, no data)."""
        n = self.batch_size + 1 if self.fold and pos == len(self) - 1 else \
            min(self.batch_size, self.n - pos * self.batch_size)
        return (*self.dist.shard_span(n), n)

    def _finish(self, batch):
        return prepare_batch(move_batch(batch, self.device), self.input_dtype, self.name)

    def fetch(self, idx: torch.Tensor):
        """The batch of dataset indices ``idx`` (in process, no workers); a 0-sample batch of the
        split's structure when ``idx`` is empty."""
        if self.tensors is not None:
            dev_idx = idx.to(self.tensors[0].device, non_blocking=True)  # async H2D, no stream sync
            return self._finish(tuple(t[dev_idx] for t in self.tensors))
        if idx.numel() == 0:
            return slice_batch(self.fetch(torch.zeros(1, dtype=torch.long)), 0, 0)
        with self._reading(f"items {idx[:4].tolist()}{'...' if len(idx) > 4 else ''}"):
            batch = self._collate([self.dataset[int(i)] for i in idx])
        return self._finish(batch)

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """An exception the user's dataset or collate function raises (e.g. an IndexError of a ``__len__``
        larger than the data) keeps its type and gets a note: the split, what was read, its len()."""
        try:
            yield
        except Exception as e:
            if hasattr(e, "add_note"):   # Python >= 3.11 (PEP 678); before, the exception as it is
                e.add_note(f"entangle_ext: raised while reading {what} of split {self.name.split('/')[-1]!r} "
                           f"(stream {self.name!r}; its len() is {self.n})")
            raise

    def _load(self, plan: Iterable[torch.Tensor]) -> Iterator[Any]:
        """Batches of the index batches of ``plan``, in order (a DataLoader when not tensors; an
        empty index batch loads sample 0 in its place, cut to 0 samples on delivery)."""
        if self.tensors is not None:
            return (self.fetch(idx) for idx in plan)
        empty: collections.deque = collections.deque()   # FIFO: the loader delivers in order

        def marked():
            for idx in plan:
                empty.append(idx.numel() == 0)
                yield idx if idx.numel() else torch.zeros(1, dtype=torch.long)
        dl = DataLoader(self.dataset, batch_sampler=_Plan(marked()),
                        collate_fn=self._collate, **self.source.loader_kwargs)

        def read(it=iter(dl)):   # the loader's reads only (not our own checks), workers started now
            with self._reading("a batch"):
                return next(it, None)
        return (self._finish(slice_batch(b, 0, 0) if empty.popleft() else b) for b in iter(read, None))

    def _feed(self, kind: str, key, plan: Callable[[], Iterable[torch.Tensor]]) -> Iterator[Any]:
        """A kept iterator over an endless plan, rebuilt when ``key`` is not where it stands."""
        if kind not in self._feeds or self._feeds[kind][0] != key:
            self._feeds[kind] = (key, self._load(plan()))
        return self._feeds[kind][1]

    def fetch_pass(self, epoch: int, limit: int) -> List[Any]:
        """The first ``limit`` batches of epoch ``epoch`` (a fresh shuffled pass per epoch). Calls
        with epoch = e, e+1, ... share one loader (workers keep prefetching)."""
        def plan():
            return (idx for e in itertools.count(epoch) for idx in self.batch_indices(e)[:limit])
        feed = self._feed("pass", (epoch, limit), plan)
        out = [next(feed) for _ in range(min(limit, len(self)))]
        self._feeds["pass"] = ((epoch + 1, limit), feed)
        return out

    def epoch_batches(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """Batches of one epoch, from batch index ``start``."""
        return self._load(self.batch_indices(epoch)[start:])

    def peek(self):
        """The next batch of the endless cycle, without advancing (see `advance`)."""
        if self.pos >= len(self):
            self.epoch, self.pos = self.epoch + 1, 0
        key = (self.epoch, self.pos)
        if self._peeked is not None and self._peeked[0] == key:
            return self._peeked[1]
        e0, p0 = key

        def plan():
            return itertools.chain(self.batch_indices(e0)[p0:], (
                i for e in itertools.count(e0 + 1) for i in self.batch_indices(e)))
        feed = self._feed("cycle", key, plan)
        batch = next(feed)
        self._feeds["cycle"] = ((e0, p0 + 1) if p0 + 1 < len(self) else (e0 + 1, 0), feed)
        self._peeked = (key, batch)
        return batch

    def advance(self) -> None:
        """Move past the batch `peek` returns (a step that consumed it has completed)."""
        self.peek()
        self.pos += 1
        self._peeked = None

    def next(self):
        """Next batch of an endless cycle (advances ``epoch``/``pos``)."""
        b = self.peek()
        self.advance()
        return b

    def close(self) -> None:
        """Drop the kept loaders (their worker processes exit)."""
        self._feeds.clear()
        self._peeked = None

    def state_dict(self) -> dict:
        """The cycling position {"epoch", "pos"} (the order itself is a function of the seed)."""
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
        self._feeds.pop("cycle", None)
        self._peeked = None
