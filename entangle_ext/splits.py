"""Split builders for the paper's settings: forget / adjacent / remote index lists (docs/algorithm.md §1).

Every builder returns an `IndexSplit`: three disjoint lists of sample indices (Python ints into the
arrays you passed, or into ``*_indices`` when given), optional per-sample ``targets`` (the coarse label
the model is trained on, after any label flip) and a JSON-serialisable ``meta`` dict describing how the
split was made. `save_split` writes it as JSON with a SHA-256 content hash; `load_split` verifies the hash.

=====================  ==============================================  ================================
builder                paper setting                                   forget / adjacent / remote
=====================  ==============================================  ================================
`split_by_hierarchy`   CIFAR-100 (superclasses), Tiny-ImageNet         fine class(es) / the other fine
                       (WordNet superclasses)                          classes of its coarse class / rest
`split_by_attributes`  CelebA (target (Male, Smiling), sub-class       one sub-class / the other
                       (Young, Eyeglasses))                            sub-classes of its target / rest
`split_by_group`       ToxiGen (toxic LGBTQ+ trained as benign)        group ∧ label / group ∧ other
                                                                       labels / other groups
`split_by_similarity`  any data set without a known hierarchy          given / k-NN neighbours / rest
=====================  ==============================================  ================================

`extract_features` gets penultimate-layer features (the input of the model's last ``nn.Linear``) or
the output of a user feature function, to feed `split_by_similarity`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ._split_checks import (as_int_array, attr_matrix, check_unique_indices, float_matrix, int_list, int_value,
                           names_list, present)
from .split_features import extract_features  # noqa: F401  (public here, beside the builder it feeds)
from .split_files import SPLIT_FORMAT, IndexSplit, load_split, save_split, split_hash  # noqa: F401

__all__ = ["IndexSplit", "split_by_hierarchy", "split_by_attributes", "split_by_group",
           "split_by_similarity", "extract_features", "save_split", "load_split", "split_hash",
           "subset_splits"]

def _finish(forget, adjacent, remote, targets, meta, index_map=None) -> IndexSplit:
    def lst(m):
        idx = np.flatnonzero(m) if m.dtype == bool else np.asarray(m)
        if index_map is not None:
            idx = index_map[idx]
        return sorted(int(i) for i in idx)
    s = IndexSplit(lst(forget), lst(adjacent), lst(remote),
                   None if targets is None else [int(t) for t in targets], meta)
    s.meta["sizes"] = s.sizes()
    if not s.forget:
        raise ValueError(f"empty forget set ({meta.get('builder')}: {meta})")
    return s


def split_by_hierarchy(fine_labels, fine_to_coarse, forget_fine: Union[int, Sequence[int]], *,
                       fine_names: Optional[Sequence[str]] = None,
                       coarse_names: Optional[Sequence[str]] = None) -> IndexSplit:
    """Superclass setting (docs/algorithm.md §1: CIFAR-100 "aquarium_fish" in "fish"; Tiny-ImageNet six dog
    classes in "mammals"): forget = samples of the ``forget_fine`` class(es), adjacent = samples of
    the other fine classes of the same coarse class, remote = all other samples.

    Args:
        fine_labels: (N,) int fine-class index per sample.
        fine_to_coarse: (F,) int coarse index of each fine class (F > max fine label); a fine class
            mapped to -1 is excluded (its samples are in no split).
        forget_fine: one fine index or a sequence of them (all must share one coarse class): a
            Python int, numpy integer or 0-d integer tensor each (a float, bool or name is refused;
            map a name to its index first, e.g. ``fine_names.index("aquarium_fish")``).
        fine_names, coarse_names: optional names recorded in ``meta``; one per fine class (F) /
            per coarse class (at least max(fine_to_coarse) + 1).
    Returns:
        `IndexSplit` with indices into ``fine_labels`` and ``targets`` = coarse label per sample
        (-1 for excluded samples).
    Raises:
        TypeError: ``forget_fine`` (or one of its entries) is not an integer (e.g. 1.5, True, a
            class name); ``fine_names`` / ``coarse_names`` given as one str.
        ValueError: ``fine_labels`` / ``fine_to_coarse`` not 1-D integer arrays (a float array is
            refused, whole values too), fine label outside ``fine_to_coarse``, a ``fine_to_coarse`` entry below -1,
            forget class unknown / excluded / in several coarse classes, ``fine_names`` /
            ``coarse_names`` too short, or no sample of the forget class(es).
    """
    fine = as_int_array(fine_labels, "fine_labels")
    f2c = as_int_array(fine_to_coarse, "fine_to_coarse")
    if fine.size and (fine.min() < 0 or fine.max() >= len(f2c)):
        raise ValueError(f"fine labels must be in [0, {len(f2c)}) (the length of fine_to_coarse)")
    if f2c.size and f2c.min() < -1:
        raise ValueError(f"fine_to_coarse entries must be coarse indices >= 0, or -1 (excluded), got {int(f2c.min())}")
    ff = int_list(forget_fine, "forget_fine", hint=" (fine-class indices; map a name to its index first, "
                   "e.g. fine_names.index(name))")
    fine_names = names_list(fine_names, len(f2c), "fine_names", "fine classes (the length of fine_to_coarse)")
    coarse_names = names_list(coarse_names, int(f2c.max()) + 1 if f2c.size else 0, "coarse_names",
                          "coarse classes (max(fine_to_coarse) + 1)")
    if not ff:
        raise ValueError("forget_fine is empty")
    for k in ff:
        if not 0 <= k < len(f2c) or f2c[k] < 0:
            raise ValueError(f"forget fine class {k} is unknown or excluded (fine_to_coarse has {len(f2c)} entries)")
    sups = {int(f2c[k]) for k in ff}
    if len(sups) != 1:
        named = lambda ids, names: ids if names is None else [f"{names[i]} ({i})" for i in ids]
        raise ValueError(f"the forget fine classes {named(ff, fine_names)} lie in several coarse classes "
                         f"{named(sorted(sups), coarse_names)}: forget classes must share one superclass")
    sup = sups.pop()
    coarse = f2c[fine] if fine.size else fine
    forget = np.isin(fine, ff)
    adjacent = (coarse == sup) & ~forget
    remote = (coarse != sup) & (coarse >= 0)
    meta = {"builder": "split_by_hierarchy", "n": int(fine.size), "forget_fine": ff, "coarse": sup,
            "adjacent_fine": sorted(int(k) for k in np.flatnonzero(f2c == sup) if k not in ff)}
    if fine_names is not None:
        meta["forget_fine_names"] = [str(fine_names[k]) for k in ff]
        meta["adjacent_fine_names"] = [str(fine_names[k]) for k in meta["adjacent_fine"]]
    if coarse_names is not None:
        meta["coarse_name"] = str(coarse_names[sup])
    if not forget.any():
        raise ValueError(f"empty forget set: no sample has fine label in {ff}")
    return _finish(forget, adjacent, remote, coarse, meta)


def split_by_attributes(attrs: Mapping[str, Any], target_attrs: Sequence[str], subclass_attrs: Sequence[str],
                        forget_subclass: Mapping[str, Union[bool, int]]) -> IndexSplit:
    """Attribute setting (docs/algorithm.md §1: CelebA, target = (Male, Smiling) → 4 classes, sub-class by
    (Young, Eyeglasses), forget = female · not smiling · not young · no eyeglasses).

    The target class of a sample is the binary number of its ``target_attrs`` (first attribute =
    most significant bit): for (Male, Smiling), 0 = female·not smiling, 1 = female·smiling,
    2 = male·not smiling, 3 = male·smiling. Forget = the samples matching ``forget_subclass`` on
    all target and sub-class attributes; adjacent = the other samples of the same target class
    (the other sub-classes); remote = the other target classes.

    Args:
        attrs: mapping attribute name → (N,) numeric or bool array; positive = present ({0,1},
            {-1,+1} or bool).
        target_attrs: names (a list, at least one) defining the 2**len target classes.
        subclass_attrs: names (a list, at least one) defining the sub-classes inside a target class.
        forget_subclass: value for every name in target_attrs + subclass_attrs, read as ``attrs``
            is: True / 1 = present, False / 0 / -1 = absent (CelebA's {-1, +1} convention works).
    Returns:
        `IndexSplit` with ``targets`` = target class per sample (int in [0, 2**len(target_attrs))).
    Raises:
        TypeError: ``target_attrs`` / ``subclass_attrs`` given as one str, ``forget_subclass`` not
            a mapping.
        ValueError: unknown attribute, an attribute column that is not numeric / bool (e.g. str)
            or holds NaN, columns of different lengths, empty or overlapping target / sub-class
            attributes, a missing or unknown key in ``forget_subclass`` or a value of it other
            than a bool or -1 / 0 / 1, or no sample in the forget sub-class.
    """
    for arg, val in (("target_attrs", target_attrs), ("subclass_attrs", subclass_attrs)):
        if isinstance(val, str):
            raise TypeError(f"{arg} must be a list of attribute names, not one str {val!r} (write [{val!r}])")
    target_attrs, subclass_attrs = list(target_attrs), list(subclass_attrs)
    if not target_attrs:
        raise ValueError("target_attrs is empty: name at least one attribute defining the target classes")
    if not subclass_attrs:
        raise ValueError("subclass_attrs is empty: name at least one attribute defining the sub-classes")
    if not isinstance(forget_subclass, Mapping):
        raise TypeError(f"forget_subclass must be a mapping attribute name -> value, got {type(forget_subclass).__name__}")
    if set(target_attrs) & set(subclass_attrs):
        raise ValueError("target_attrs and subclass_attrs must not overlap")
    t = attr_matrix(attrs, target_attrs)
    s = attr_matrix(attrs, subclass_attrs)
    if t.shape[0] != s.shape[0]:
        raise ValueError(f"attribute columns have different lengths ({t.shape[0]} vs {s.shape[0]})")
    need = target_attrs + subclass_attrs
    missing = [n for n in need if n not in forget_subclass]
    extra = [n for n in forget_subclass if n not in need]
    if missing or extra:
        raise ValueError(f"forget_subclass must give exactly {need}; missing {missing}, unexpected {extra}")
    n = t.shape[0]
    target = (t.astype(np.int64) * (1 << np.arange(len(target_attrs))[::-1])).sum(1) if n else np.zeros(0, np.int64)
    want = {a: present(forget_subclass[a], a) for a in need}
    want_t = np.array([want[a] for a in target_attrs])
    want_s = np.array([want[a] for a in subclass_attrs])
    f_target = int((want_t.astype(np.int64) * (1 << np.arange(len(target_attrs))[::-1])).sum())
    in_target = target == f_target
    forget = in_target & (s == want_s).all(1)
    meta = {"builder": "split_by_attributes", "n": int(n), "target_attrs": target_attrs,
            "subclass_attrs": subclass_attrs, "forget_subclass": {k: want[k] for k in forget_subclass},
            "forget_target": f_target}
    if not forget.any():
        raise ValueError(f"empty forget set: no sample matches {meta['forget_subclass']}")
    return _finish(forget, in_target & ~forget, ~in_target, target, meta)


def split_by_group(groups, labels, forget_group, forget_label: int, flip_label: Optional[int] = None) -> IndexSplit:
    """Group setting (docs/algorithm.md §1: ToxiGen, forget = toxic statements about LGBTQ+ whose labels were
    flipped to benign before training, adjacent = benign LGBTQ+ statements, remote = other groups).

    Args:
        groups: (N,) group id per sample (str or int; compared with ``==``).
        labels: (N,) int true label per sample (ToxiGen: 1 toxic, 0 benign).
        forget_group: the group whose samples with ``forget_label`` are forgotten.
        forget_label: label of the forget samples (an integer: Python int, numpy integer or 0-d
            integer tensor; a float or bool is refused).
        flip_label: if given (an integer, as ``forget_label``), ``targets`` of the forget samples
            become ``flip_label`` (the label the original model was trained on, and the one it
            must stop predicting).
    Returns:
        `IndexSplit`; ``targets`` = ``labels`` with the flip applied.
    Raises:
        TypeError: ``forget_label`` / ``flip_label`` not an integer; ``groups`` given as one str.
        ValueError: ``labels`` not a 1-D integer array (a float array is refused, whole values too),
            length mismatch, unknown group, no sample of that group with that label, or a
            negative ``flip_label``.
    """
    if isinstance(groups, str):
        raise TypeError(f"groups must be a sequence with one group per sample, not one str {groups!r}")
    forget_label = int_value(forget_label, "forget_label")
    flip_label = None if flip_label is None else int_value(flip_label, "flip_label")
    if flip_label is not None and flip_label < 0:
        raise ValueError(f"flip_label must be a class index >= 0 (the label the forget samples become), "
                         f"got {flip_label}")
    g = np.asarray([str(x) for x in (groups.tolist() if hasattr(groups, "tolist") else groups)])
    y = as_int_array(labels, "labels")
    if len(g) != len(y):
        raise ValueError(f"groups ({len(g)}) and labels ({len(y)}) differ in length")
    fg = str(forget_group)
    if fg not in set(g.tolist()):
        raise ValueError(f"unknown group {forget_group!r}; groups: {sorted(set(g.tolist()))}")
    in_group = g == fg
    forget = in_group & (y == int(forget_label))
    targets = y.copy()
    if flip_label is not None:
        targets[forget] = int(flip_label)
    meta = {"builder": "split_by_group", "n": int(len(y)), "forget_group": fg, "forget_label": int(forget_label),
            "flip_label": None if flip_label is None else int(flip_label)}
    if not forget.any():
        raise ValueError(f"empty forget set: group {fg!r} has no sample with label {forget_label}")
    return _finish(forget, in_group & ~forget, ~in_group, targets, meta)


def split_by_similarity(features_retain, features_forget, k: int = 10, fraction: float = 0.05, *,
                        metric: str = "cosine", retain_indices=None, forget_indices=None,
                        chunk: int = 1024) -> IndexSplit:
    """Adjacent set from feature similarity, for data without a known hierarchy: each forget sample
    votes for its ``k`` nearest retain samples; retain samples are ranked by their number of votes
    (ties broken by the distance to their nearest forget sample) and the top ``fraction`` becomes
    D_adj, the rest D_rem. Use features in which the model's classes are visible (penultimate
    features of the original model, `extract_features`).

    Args:
        features_retain: (R, D) real retain features (numpy array or tensor of any real or bool
            dtype, computed in float32); features_forget: (Fn, D), the same. Every entry must be
            finite (after the cast to float32).
        k: neighbours per forget sample, an integer (Python int, numpy integer or 0-d integer
            tensor; not a bool or float) with 1 ≤ k ≤ R. fraction: share of retain samples put in
            D_adj, a real number in (0, 1]; the count is ``round(fraction * R)``, at least 1.
        metric: "cosine" (features L2-normalised) or "euclidean".
        retain_indices, forget_indices: optional (R,) / (Fn,) integer global indices the returned
            lists are mapped to; default = positions 0..R-1 in features_retain and 0..Fn-1 in
            features_forget (then forget and retain indices live in *different* index spaces).
            ``meta["index_space"]`` says which space each list is in: "global" (both given), else
            "<retain> / <forget>", each side "positions in features_retain" / "positions in
            features_forget" or "retain_indices" / "forget_indices".
        chunk: forget rows per distance block (memory: chunk × R floats), an integer >= 1.
    Returns:
        `IndexSplit` (targets None); ``meta`` records k, fraction, metric and the index space.
    Raises:
        TypeError: k or chunk not an integer, fraction not a real number, features of a
            non-numeric dtype (e.g. str) or complex.
        ValueError: empty inputs, features not 2-D or holding NaN / infinite values, feature
            widths differ, k, chunk or fraction out of range, unknown metric, index lists whose
            lengths differ from the row counts, that are not integer arrays (float ones are refused,
            whole values too) or that hold a negative or repeated index (also when
            only one of them is given), forget and retain indices that overlap (both given).
    """
    fr = float_matrix(features_retain, "features_retain")
    ff = float_matrix(features_forget, "features_forget")
    R, Fn = fr.shape[0], ff.shape[0]
    if Fn == 0:
        raise ValueError("empty forget set: features_forget has no rows")
    if R == 0:
        raise ValueError("features_retain has no rows")
    if fr.shape[1] != ff.shape[1]:
        raise ValueError(f"feature widths differ: retain {fr.shape[1]}, forget {ff.shape[1]}")
    k = int_value(k, "k")
    if not 1 <= k <= R:
        raise ValueError(f"k must be in [1, {R}] (the retain rows), got {k}")
    chunk = int_value(chunk, "chunk", minimum=1)
    if isinstance(fraction, (np.ndarray, torch.Tensor)) and fraction.ndim == 0 and fraction.dtype not in (torch.bool, np.bool_) \
            and not (fraction.is_complex() if isinstance(fraction, torch.Tensor) else np.iscomplexobj(fraction)):
        fraction = fraction.item()   # a 0-d real array / tensor, as before
    if isinstance(fraction, (bool, np.bool_)) or not isinstance(fraction, (int, float, np.integer, np.floating)):
        raise TypeError(f"fraction must be a real number in (0, 1], got {type(fraction).__name__} {fraction!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    rmap, fmap = _index_maps(retain_indices, forget_indices, R, Fn)
    if metric == "cosine":
        fr = torch.nn.functional.normalize(fr, dim=1)
        ff = torch.nn.functional.normalize(ff, dim=1)
    elif metric != "euclidean":
        raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}")
    votes = torch.zeros(R, dtype=torch.long)
    nearest = torch.full((R,), float("inf"))
    for s in range(0, Fn, chunk):
        d = torch.cdist(ff[s:s + chunk], fr)              # (c, R)
        idx = d.topk(k, dim=1, largest=False).indices
        votes += torch.bincount(idx.reshape(-1), minlength=R)
        nearest = torch.minimum(nearest, d.min(0).values)
    n_adj = max(1, int(round(fraction * R)))
    # sort by (-votes, nearest): stable lexicographic via two stable sorts
    o1 = torch.argsort(nearest, stable=True)
    order = o1[torch.argsort(-votes[o1], stable=True)]
    adj_mask = np.zeros(R, bool)
    adj_mask[order[:n_adj].numpy()] = True
    if retain_indices is not None and forget_indices is not None:
        space = "global"
    else:
        space = (("retain_indices" if retain_indices is not None else "positions in features_retain") + " / "
                 + ("forget_indices" if forget_indices is not None else "positions in features_forget"))
    meta = {"builder": "split_by_similarity", "k": int(k), "fraction": float(fraction), "metric": metric,
            "n_retain": int(R), "n_forget": int(Fn), "index_space": space,
            "votes_of_adjacent_min": int(votes[order[n_adj - 1]])}
    s = IndexSplit(sorted(int(i) for i in fmap), sorted(int(i) for i in rmap[adj_mask]),
                   sorted(int(i) for i in rmap[~adj_mask]), None, meta)
    s.meta["sizes"] = s.sizes()
    if retain_indices is not None and forget_indices is not None:
        s.check()
    return s


def _index_maps(retain_indices, forget_indices, R: int, Fn: int):
    """The global indices of the retain / forget feature rows (positions when not given), each
    given list checked: R / Fn entries, none negative or repeated (both given: `IndexSplit.check`
    also refuses overlap between them)."""
    rmap = np.arange(R) if retain_indices is None else as_int_array(retain_indices, "retain_indices")
    fmap = np.arange(Fn) if forget_indices is None else as_int_array(forget_indices, "forget_indices")
    if len(rmap) != R or len(fmap) != Fn:
        raise ValueError(f"retain_indices ({len(rmap)}) / forget_indices ({len(fmap)}) must match the feature "
                         f"row counts ({R} / {Fn})")
    for arr, name, given in ((rmap, "retain_indices", retain_indices), (fmap, "forget_indices", forget_indices)):
        if given is not None:
            check_unique_indices(arr, name)
    return rmap, fmap


def _check_split_indices(split: IndexSplit, n: int, what: str) -> None:
    """ValueError unless ``split`` is consistent (`IndexSplit.check`) and each of its indices lies in
    [0, n) (``n`` = the length of the dataset ``what``)."""
    if not isinstance(split, IndexSplit):
        raise TypeError(f"{what} split must be an IndexSplit, got {type(split).__name__}")
    space = split.meta.get("index_space", "global") if isinstance(split.meta, dict) else "global"
    if space != "global":
        raise ValueError(f"the {what} split's lists are in different index spaces ({space}): pass both "
                         "retain_indices and forget_indices to split_by_similarity to index one dataset")
    split.check()
    for name in IndexSplit.NAMES:
        lst = getattr(split, name)
        if lst and max(lst) >= n:
            bad = [i for i in lst if i >= n]
            raise ValueError(f"split {name!r} holds indices beyond {what} (length {n}): {bad[:5]}"
                             f"{' ...' if len(bad) > 5 else ''} ({len(bad)} in all); the split was made for "
                             "another dataset")


def subset_splits(dataset, split: IndexSplit, *, test_dataset=None, test_split: Optional[IndexSplit] = None):
    """`entangle_ext.Splits` of `torch.utils.data.Subset` views of ``dataset`` (and of
    ``test_dataset`` for the held-out parts). The datasets must already return the split's targets.

    Args:
        dataset: a map-style dataset (``len`` and integer indexing) the indices of ``split`` point into.
        split: an `IndexSplit` over ``dataset``.
        test_dataset, test_split: both or neither: the held-out dataset and its `IndexSplit`.
    Returns:
        `entangle_ext.Splits` (forget / adjacent / remote, plus their ``*_test`` with the test pair).
    Raises:
        TypeError: a split that is not an `IndexSplit`, a dataset without ``len``.
        ValueError: only one of ``test_dataset`` / ``test_split`` given; a split that is
            inconsistent (`IndexSplit.check`: overlapping lists, duplicate, negative or non-integer
            indices, an empty forget list), a `split_by_similarity` split whose lists are in
            different index spaces (``meta["index_space"]`` not "global"), or one that holds an index >= the length of its dataset (checked
            here, before any sample is read); an empty split.
    """
    from torch.utils.data import Subset
    from .unlearn.data import Splits

    if (test_dataset is None) != (test_split is None):
        raise ValueError("give test_dataset and test_split together (the held-out dataset and its IndexSplit), "
                         "or neither")
    for ds, sp, what in ((dataset, split, "dataset"), (test_dataset, test_split, "test_dataset")):
        if sp is None:
            continue
        if not hasattr(ds, "__len__"):
            raise TypeError(f"{what} must be a map-style dataset with a length, got {type(ds).__name__}")
        _check_split_indices(sp, len(ds), what)
    kw = {n: Subset(dataset, getattr(split, n)) for n in IndexSplit.NAMES}
    if test_dataset is not None and test_split is not None:
        kw.update({n + "_test": Subset(test_dataset, getattr(test_split, n)) for n in IndexSplit.NAMES})
    s = Splits(**kw)
    s.check()
    return s
