"""The entangle_ext operators inside someone else's plain PyTorch training loop (no driver).

A hand-written loop on sklearn's digits (parity labels; forget digit 3, siblings 1/5/7/9, remote =
even digits; see `entangle_ext.data.digits`) that uses the operators directly:

* ``entangle_ext.wasserstein2_1d(u, v)`` - exact 1-D W2² between the per-sample forget losses of the
  model and of a frozen snapshot (the W2 anchor of Stage 2, docs/algorithm.md §3, §4);
* ``entangle_ext.project_orthogonal_(grads, basis, rcond=...)`` - in-place projection of the adjacent
  gradient off span{g_f, g_rem} (Stage 2, docs/algorithm.md §5);
* ``entangle_ext.dual_update_(lam, g, mu, kind="equality")`` and ``entangle_ext.AugmentedLagrangian``
  - the Stage 1 multiplier update / penalty.

    python python_examples/dropin_ops.py
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

import entangle_ext as ee
from entangle_ext.data.digits import digits_splits


def acc(model, ds):
    x, y = ds.tensors
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def main(argv=None):
    argparse.ArgumentParser(prog="dropin_ops", description=__doc__.split("\n\n")[0]).parse_args(argv)
    torch.manual_seed(0)
    f64 = torch.float64   # the printed figures then do not depend on the CPU (entangle_ext/data/digits.py)
    s, _ = digits_splits(seed=0, dtype=f64)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, dtype=f64), torch.nn.ReLU(), torch.nn.Linear(128, 2, dtype=f64))

    # --- their ordinary training loop -------------------------------------------------------
    x_all = torch.cat([s.forget.tensors[0], s.adjacent.tensors[0], s.remote.tensors[0]])
    y_all = torch.cat([s.forget.tensors[1], s.adjacent.tensors[1], s.remote.tensors[1]])
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for epoch in range(60):
        for idx in torch.randperm(len(y_all)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
    report = lambda tag: print(f"{tag:<9} forget {acc(model, s.forget_test):6.1f}  adjacent "
                               f"{acc(model, s.adjacent_test):6.1f}  remote {acc(model, s.remote_test):6.1f}"
                               "  (test acc %)")
    report("original")

    # --- Stage 1 in their loop: ascend on D_f, keep L_rem at its original value (AL + dual_update_) --
    xf, yf = s.forget.tensors
    xr, yr = s.remote.tensors
    xa, ya = s.adjacent.tensors
    with torch.no_grad():
        c0 = F.cross_entropy(model(xr), yr)
    al = ee.AugmentedLagrangian(c0, mu=10.0)          # owns λ, μ and the pinned c0 on the device
    opt = torch.optim.Adam(model.parameters(), 3e-4)
    for step in range(150):
        ir, i_f = torch.randint(len(yr), (32,)), torch.randint(len(yf), (16,))
        g = al.constraint(F.cross_entropy(model(xr[ir]), yr[ir]))
        ce_f = F.cross_entropy(model(xf[i_f]), yf[i_f], reduction="none")
        loss = -(ce_f * (ce_f < 10).float()).mean() + al.penalty(g)    # λg + μ/2 g² (fused op)
        opt.zero_grad()
        loss.backward()
        opt.step()
        al.update()                                                     # λ ← λ + μg (dual_update_)
    report("stage 1")

    # --- Stage 2 in their loop: repair D_adj with projected SGD, W2-anchored forget losses -------
    frozen = copy.deepcopy(model).requires_grad_(False)
    params = [p for p in model.parameters()]
    alpha, lr, v = 0.5, 2e-3, None

    def grads_of(loss):
        return [g.detach() for g in torch.autograd.grad(loss, params)]

    for epoch in range(15):
        for idx in torch.randperm(len(ya)).split(32):
            g_adj = grads_of(F.cross_entropy(model(xa[idx]), ya[idx]))
            nl = -F.cross_entropy(model(xf), yf, reduction="none")                 # −ℓ_i(θ)
            with torch.no_grad():
                nl_ref = -F.cross_entropy(frozen(xf), yf, reduction="none")        # −ℓ_i(θ̄)
            g_f = grads_of((1 - alpha) * nl.mean() + alpha * ee.wasserstein2_1d(nl, nl_ref))
            g_rem = grads_of(F.cross_entropy(model(xr), yr))
            v = g_adj if v is None else [0.9 * a + b for a, b in zip(v, g_adj)]
            v = [t.clone() for t in v]
            ee.project_orthogonal_(v, [g_f, g_rem], rcond=1e-10)                   # in place
            with torch.no_grad():
                for p, d in zip(params, v):
                    p.sub_(lr * d)
    report("stage 2")


if __name__ == "__main__":
    main()
