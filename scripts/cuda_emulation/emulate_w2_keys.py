import sys, numpy as np, torch
import os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulate_w2 as W
rng = np.random.default_rng(3)
specials32 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 3.4028235e38, -3.4028235e38], np.float32)
for dt, key, sp in ((torch.float32, W.key32, specials32), (torch.float64, W.key64, np.array([0.0,-0.0,np.inf,-np.inf,np.nan,-np.nan,5e-324,-5e-324,1.7976931348623157e308,-1.7976931348623157e308]))):
    for t in range(200):
        n = int(rng.integers(1, 40))
        x = np.concatenate([rng.standard_normal(n) * 10.0 ** rng.integers(-40, 40), rng.choice(sp, int(rng.integers(0, 6)))])
        rng.shuffle(x)
        xt = torch.tensor(x, dtype=dt)
        _, perm, _ = torch.ops.entangle_ext.wasserstein2_1d(xt, xt, torch.tensor([0, len(x)]), torch.tensor([0, len(x)]), -1)
        xs = [float(v) for v in xt]
        mine = sorted(range(len(xs)), key=lambda p: key(xs[p]))
        assert mine == perm.tolist(), (dt, xs)
print("order-preserving keys reproduce the CPU stable order (specials, subnormals, +-0, NaN)")
