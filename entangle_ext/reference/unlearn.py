"""A deliberately naive plain-PyTorch transcription of the reference recipe of both stages
(docs/algorithm.md §2, §3, §7), the way the authors' reference implementation runs them.

It is the test oracle of the run (tests/unlearn/test_fidelity.py compares `entangle_ext.stage1` /
`stage2` with it parameter for parameter in float64) and the baseline of bench/bench_unlearn.py:
batch-by-batch loops, `.backward()` into ``.grad``, a host-side (`.item()`) dual update, the forget
loader wrapped in `itertools.cycle` (its first pass replayed), the ToxiGen confidence penalty on
the unclipped CE, and the 2×2 normal equations of the projection accumulated per parameter tensor
in float64 with a ridge of 1e-8 added per tensor (docs/algorithm.md §7). It shares no code with
`entangle_ext.unlearn` except the data order, which callers pass in as explicit batches
(`driver_order_stage1` / `driver_order_stage2` draw them as the run does).
"""
import copy
import itertools

import torch
import torch.nn.functional as F


def naive_c0(model, remote_batches):
    tot, n = 0.0, 0
    with torch.no_grad():
        for x, y in remote_batches:
            tot += F.cross_entropy(model(x), y, reduction="sum").item()
            n += len(y)
    return tot / n


def naive_stage1(model, remote_batches, forget_loader, *, lr, mu=10.0, clip=10.0, c0=None,
                 cycle=True, small_punish=False, small_punish_factor=1.0):
    """remote_batches: the remote minibatches of every epoch, in order; forget_loader: an iterable
    whose every iteration is one pass over the forget minibatches (like a shuffling DataLoader).
    ``cycle=True`` wraps it in `itertools.cycle` as the reference does (the first pass is
    replayed); ``cycle=False`` starts a new pass of the loader whenever one ends. Returns the
    final λ (float)."""
    model.eval()
    if c0 is None:
        c0 = naive_c0(model, remote_batches)
    lam = 0.0
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    fit = itertools.cycle(forget_loader) if cycle else \
        (b for _ in itertools.count() for b in forget_loader)
    for xr, yr in remote_batches:
        xf, yf = next(fit)
        g = F.cross_entropy(model(xr), yr) - c0
        ce_f = F.cross_entropy(model(xf), yf, reduction="none")
        clipped = torch.where(ce_f < clip, ce_f, clip + (ce_f - clip).detach())
        if small_punish:
            clipped = clipped - small_punish_factor / (ce_f + 1e-3)
        loss = -clipped.mean() + lam * g + mu / 2 * g ** 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        lam = lam + mu * g.item()
    return lam


def _grad_list(model):
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters()]


def naive_stage2(model, steps, *, lr, alpha=0.5, momentum=0.9, ridge=1e-8):
    """steps: list of (adjacent_batch, [forget batches], [remote batches]) per step, in order.
    ``ridge`` is added to both diagonal entries of the Gram matrix once per parameter tensor."""
    model.eval()
    ref = copy.deepcopy(model)
    params = list(model.parameters())
    v = [torch.zeros_like(p) for p in params]
    opt = torch.optim.SGD(params, lr=lr)
    for (xa, ya), fbs, rbs in steps:
        model.zero_grad()
        F.cross_entropy(model(xa), ya).backward()
        g_adj = _grad_list(model)

        model.zero_grad()
        for xf, yf in fbs:
            l = F.cross_entropy(model(xf), yf, reduction="none")
            with torch.no_grad():
                l_ref = F.cross_entropy(ref(xf), yf, reduction="none")
            a = torch.sort(-l).values
            b = torch.sort(-l_ref).values
            w2 = ((a - b) ** 2).mean()
            ((1 - alpha) * (-l).mean() + alpha * w2).backward()
        g_f = _grad_list(model)

        model.zero_grad()
        for xr, yr in rbs:
            F.cross_entropy(model(xr), yr).backward()
        g_rem = _grad_list(model)

        v = [momentum * vi + gi for vi, gi in zip(v, g_adj)]
        G = torch.zeros(2, 2, dtype=torch.float64)
        rhs = torch.zeros(2, dtype=torch.float64)
        for vi, fi, ri in zip(v, g_f, g_rem):
            vi, fi, ri = vi.double(), fi.double(), ri.double()
            G[0, 0] += (fi * fi).sum().item() + ridge
            G[0, 1] += (fi * ri).sum().item()
            G[1, 1] += (ri * ri).sum().item() + ridge
            rhs[0] += (fi * vi).sum().item()
            rhs[1] += (ri * vi).sum().item()
        G[1, 0] = G[0, 1]
        c = torch.linalg.solve(G, rhs)
        v = [vi - (c[0] * fi.double() + c[1] * ri.double()).to(vi.dtype)
             for vi, fi, ri in zip(v, g_f, g_rem)]
        opt.zero_grad()
        for p, vi in zip(params, v):
            p.grad = vi.clone()
        opt.step()
    return v


def _stream(dataset, batch_size, seed, name, device):
    from entangle_ext.unlearn.data import BatchStream
    return BatchStream(dataset, batch_size, shuffle=True, seed=seed, name=name, device=device)


class DriverOrderLoader:
    """An iterable whose k-th iteration yields the batches of the run's stream in the order of
    its epoch k: a shuffling DataLoader as the run draws it."""

    def __init__(self, stream):
        self.stream, self.passes = stream, 0

    def __iter__(self):
        e, self.passes = self.passes, self.passes + 1
        return (self.stream.fetch(i) for i in self.stream.batch_indices(e))


def driver_order_stage1(splits, cfg1, seed, device="cpu"):
    """The remote batches of every epoch and a forget "loader" in the order the run draws them
    (the run's forget stream reshuffles each pass; ``cycle=True`` in `naive_stage1` replays
    the first one as the reference recipe does)."""
    rem = _stream(splits.remote, cfg1.remote_batch_size, seed, "s1/remote", device)
    fgt = _stream(splits.forget, cfg1.forget_batch_size, seed, "s1/forget", device)
    remote = [b for e in range(cfg1.epochs) for b in rem.epoch_batches(e)]
    if cfg1.max_steps is not None:
        remote = remote[:cfg1.max_steps]
    return remote, DriverOrderLoader(fgt)


def driver_order_stage2(splits, cfg2, seed, device="cpu"):
    """Per-step (adjacent batch, forget batches, remote batches) in the run's order, as a list."""
    return list(iter_driver_order_stage2(splits, cfg2, seed, device))


def iter_driver_order_stage2(splits, cfg2, seed, device="cpu"):
    """`driver_order_stage2` one step at a time (a generator: each step's batches are fetched when
    it is reached, so a long run does not hold all of them at once)."""
    adj = _stream(splits.adjacent, cfg2.adjacent_batch_size, seed, "s2/adjacent", device)
    fgt = _stream(splits.forget, cfg2.forget_batch_size, seed, "s2/forget", device)
    rem = _stream(splits.remote, cfg2.remote_batch_size, seed, "s2/remote", device)
    step = 0
    for e in range(cfg2.epochs):
        for ab in adj.epoch_batches(e):
            flimit = cfg2.forget_batch_limit if cfg2.w2_scope == "minibatch" else None   # "forget_set": all of D_f
            fbs = [fgt.fetch(i) for i in fgt.batch_indices(step)[:flimit]]
            rbs = [rem.fetch(i) for i in rem.batch_indices(step)[:cfg2.remote_batch_limit]]
            yield ab, fbs, rbs
            step += 1
