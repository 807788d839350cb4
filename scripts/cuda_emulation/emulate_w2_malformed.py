# Malformed offsets (validate=False): every global index the emulated CUDA kernels touch must be in range.
import sys, numpy as np
import os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulate_w2 as W  # runs the main check too (quick)
class Guard(list):
    def __getitem__(self, i):
        assert isinstance(i, int) and 0 <= i < len(self), (i, len(self)); return list.__getitem__(self, i)
    def __setitem__(self, i, v):
        assert isinstance(i, int) and 0 <= i < len(self), (i, len(self)); list.__setitem__(self, i, v)
rng = np.random.default_rng(1)
for trial in range(400):
    S = int(rng.integers(1, 6)); Nu = int(rng.integers(0, 15)); Nv = int(rng.integers(0, 15))
    uo = Guard(int(x) for x in rng.integers(-4, 20, S + 1)); vo = Guard(int(x) for x in rng.integers(-4, 20, S + 1))
    u = Guard(float(x) for x in rng.integers(-3, 4, Nu)); v = Guard(float(x) for x in rng.integers(-3, 4, Nv))
    # device path forward (cost kernel reads) with guarded arrays
    o, up, vp = W.device_path(u, v, uo, vo, W.key32)
    up, vp = Guard(up), Guard(vp)
    # backward kernel emulation (index logic only)
    for p in range(Nu + Nv):
        on_u = p < Nu; q = p if on_u else p - Nu
        s = W.find_segment(uo if on_u else vo, S, q)
        ulo, uhi = W.seg_bounds(uo, s, Nu); vlo, vhi = W.seg_bounds(vo, s, Nv); na, nb = uhi-ulo, vhi-vlo
        if na == 0 or nb == 0: continue
        if on_u:
            if not (ulo <= q < uhi): continue
            src = up[q]; i = q - ulo; jl, jh = W.overlap_range(i, na, nb)
            for j in range(jl, jh + 1): vp[vlo + j]
        else:
            if not (vlo <= q < vhi): continue
            src = vp[q]; j = q - vlo; il, ih = W.overlap_range(j, nb, na)
            for i in range(il, ih + 1): up[ulo + i]
    # block path
    W.block_path(u, v, uo, vo, W.key32, 16)
print("malformed offsets: all emulated accesses in range")
