"""Small things the tests share (one home): the 64-32-2 MLP on the digits miniature, a two-stage
config of a few steps, parameter flattening, a model that turns NaN, a dict-item dataset and a
keyword-input model for it, variable-length token data with its collate function and model, and
the random tensors / tensor lists of the projection tests. Fixtures (``small``, ``one_thread``) live in
conftest.py."""
import dataclasses

import torch
from torch.utils.data import Dataset


def mlp(seed=0):
    """64 → 32 → ReLU → 2, float32, initialised from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


class AutocastProbe(torch.nn.Module):
    """`mlp` that appends (CPU autocast on, logits dtype) to ``seen`` at every forward pass."""
    def __init__(self, seen):
        super().__init__()
        self.net, self.seen = mlp(), seen

    def forward(self, x):
        out = self.net(x)
        self.seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
        return out


def tiny_config(*, stage1=None, stage2=None, log_every=2, **top):
    """The digits preset cut to a few steps on ``small`` (Stage 1: 7 steps, Stage 2: 3 steps), with
    ``stage1`` / ``stage2`` field overrides on top and top-level UnlearnConfig fields ``top``."""
    import entangle_ext as ee
    cfg = ee.UnlearnConfig.preset("digits", log_every=log_every, **top)
    cfg.stage1 = dataclasses.replace(cfg.stage1, **{"epochs": 1, "remote_batch_size": 16, **(stage1 or {})})
    cfg.stage2 = dataclasses.replace(cfg.stage2, **{"epochs": 1, "adjacent_batch_size": 32, "forget_batch_size": 8,
                                                    "forget_batch_limit": 2, "remote_batch_size": 32,
                                                    "remote_batch_limit": 2, **(stage2 or {})})
    return cfg


def flat_of(tensors):
    """The tensors, flattened and concatenated."""
    return torch.cat([t.reshape(-1) for t in tensors])


def params(model):
    """Every parameter of ``model``, detached, flattened and concatenated."""
    return flat_of(p.detach() for p in model.parameters())


class Keyword(torch.nn.Module):
    """`mlp` called as ``model(pixels=...)`` (for dict items, e.g. `DictDS`'s default key)."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, pixels):
        return self.net(pixels)


class NaNAfter(torch.nn.Module):
    """`mlp` that outputs NaN from its (k+1)-th gradient-enabled forward call on."""

    def __init__(self, k):
        super().__init__()
        self.net, self.k, self.calls = mlp(), k, 0

    def forward(self, x):
        out = self.net(x)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls > self.k:
                out = out * float("nan")
        return out


class DictDS(Dataset):
    """A TensorDataset's (x, y) items as Hugging-Face-style dicts {inputs: x, label: y}."""

    def __init__(self, tds, label="labels", inputs="pixels"):
        self.x, self.y = tds.tensors
        self.label, self.inputs = label, inputs

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {self.inputs: self.x[i], self.label: self.y[i]}


class Tokens(Dataset):
    """Variable-length token sequences; dict items with the Hugging Face column name "label"."""

    def __init__(self, n, label, seed):
        g = torch.Generator().manual_seed(seed)
        self.seqs = [torch.randint(0, 20, (int(torch.randint(2, 9, (), generator=g)),), generator=g)
                     for _ in range(n)]
        self.label = label

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return {"input_ids": self.seqs[i], "label": self.label}


def pad_collate(items):
    """`Tokens` items → {input_ids (B, L) int64 zero-padded, attention_mask (B, L), label (B,) int32}."""
    n = max(len(it["input_ids"]) for it in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros(len(items), n)
    for j, it in enumerate(items):
        ids[j, :len(it["input_ids"])] = it["input_ids"]
        mask[j, :len(it["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "label": torch.tensor([it["label"] for it in items], dtype=torch.int32)}


class BagOfTokens(torch.nn.Module):
    """Mean of 8-d token embeddings (vocabulary 20) over the mask → 2 logits; keyword inputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(20, 8), torch.nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        e = (self.emb(input_ids) * attention_mask[..., None]).sum(1) / attention_mask.sum(1, keepdim=True)
        return self.out(e)


# ------------------------------------------------------------------ projection tests: random tensors
def rand(shape, gen, dtype=torch.float64):
    """Standard normal entries drawn in float64 from ``gen``, then cast to ``dtype``."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def make_lists(shapes, k, gen, dtype=torch.float64, device="cpu"):
    """(grads, basis): one tensor per shape, and k basis rows of the same shapes."""
    grads = [rand(s, gen, dtype).to(device) for s in shapes]
    basis = [[rand(s, gen, dtype).to(device) for s in shapes] for _ in range(k)]
    return grads, basis
