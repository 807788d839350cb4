"""Host emulation of the reduction of csrc/cuda/wasserstein.cu (segment_partial_kernel) in float32:
relative error of one block summing a long segment (C=1) vs 64 chunks. Motivated the float64 sums."""
# Float32 accumulation error of segment_partial_kernel when one long segment gets C=1 (short mean).
import numpy as np
rng = np.random.default_rng(0)
for n in (10**6, 10**7, 4*10**7):
    a = np.sort(rng.standard_normal(n)).astype(np.float32); b = np.sort(rng.standard_normal(n) * 2).astype(np.float32)
    cost = ((a - b).astype(np.float32) ** 2).astype(np.float32)  # w=1 for equal sizes
    exact = np.sum(cost.astype(np.float64))
    for C in (1, 64):
        cu = (n + C - 1) // C; tot = np.float64(0)
        for c in range(C):
            chunk = cost[c*cu:(c+1)*cu]
            pad = (-len(chunk)) % 256
            per = np.cumsum(np.concatenate([chunk, np.zeros(pad, np.float32)]).reshape(-1, 256), axis=0, dtype=np.float32)[-1]
            tot += np.float64(np.float32(np.sum(per.astype(np.float32))))
        print(f"n={n:>9} C={C:>2} rel.err={abs(tot-exact)/exact:.2e}")
