# Host emulation of csrc/cuda/wasserstein.cu (device path + block path) vs the CPU op.
import sys, numpy as np, torch
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import entangle_ext as ee  # registers ops

def key32(x):
    x = np.float32(x)
    if x != x: x = np.array([0x7fc00000], np.uint32).view(np.float32)[0]
    if x == 0: x = np.float32(0.0)
    b = int(np.array([x], np.float32).view(np.uint32)[0])
    return (~b & 0xffffffff) if (b & 0x80000000) else (b | 0x80000000)
def key64(x):
    x = np.float64(x)
    if x != x: x = np.array([0x7ff8000000000000], np.uint64).view(np.float64)[0]
    if x == 0: x = 0.0
    b = int(np.array([x], np.float64).view(np.uint64)[0])
    return (~b & (2**64-1)) if (b >> 63) else (b | (1 << 63))

def seg_bounds(off, s, n):
    a = min(max(off[s], 0), n); b = min(max(off[s+1], a), n); return a, b
def find_segment(off, S, p):
    lo, hi = 0, S
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if off[mid] <= p: lo = mid
        else: hi = mid
    return lo
def bits_for(S):
    b = 1
    while b < 63 and (1 << b) < S: b += 1
    return b
def overlap_range(i, na, nb): return (i*nb)//na, ((i+1)*nb-1)//na
def overlap_weight(i, j, na, nb):
    lo = max(i*nb, j*na); hi = min((i+1)*nb, (j+1)*na); return max(hi-lo, 0)

def device_argsort(x, off, key):
    N = len(x); S = len(off)-1
    if N == 0: return []
    sbits = bits_for(S) if S > 1 else 0
    # stable LSD sort == stable sort by full key; emulate masked key ranges
    fuse = S > 1 and key is key32 and sbits <= 32
    if fuse:
        mask = (1 << (32+sbits)) - 1
        k = [((find_segment(off, S, p) << 32) | key(x[p])) & mask for p in range(N)]
        return sorted(range(N), key=lambda p: k[p])
    byv = sorted(range(N), key=lambda p: key(x[p]))
    if S <= 1: return byv
    sk = [find_segment(off, S, byv[p]) & ((1 << sbits)-1) for p in range(N)]
    order = sorted(range(N), key=lambda p: sk[p])
    return [byv[p] for p in order]

def device_path(u, v, uo, vo, key, C=None):
    S = len(uo)-1; Nu, Nv = len(u), len(v)
    up = device_argsort(u, uo, key); vp = device_argsort(v, vo, key)
    cost = [0.0]*(Nu+Nv)
    for p in range(Nu+Nv):
        on_u = p < Nu; q = p if on_u else p-Nu
        s = find_segment(uo if on_u else vo, S, q)
        ulo, uhi = seg_bounds(uo, s, Nu); vlo, vhi = seg_bounds(vo, s, Nv)
        na, nb = uhi-ulo, vhi-vlo; c = 0.0
        if on_u and ulo <= q < uhi and na >= nb and nb > 0:
            i = q-ulo; ai = u[up[q]]; jl, jh = overlap_range(i, na, nb)
            for j in range(jl, jh+1): c += overlap_weight(i, j, na, nb)*(ai - v[vp[vlo+j]])**2
        elif (not on_u) and vlo <= q < vhi and nb > na and na > 0:
            j = q-vlo; bj = v[vp[q]]; il, ih = overlap_range(j, nb, na)
            for i in range(il, ih+1): c += overlap_weight(j, i, nb, na)*(bj - u[up[ulo+i]])**2
        cost[p] = c
    if C is None:
        mean_len = (max(Nu, Nv)+S-1)//S; C = max(1, min(64, mean_len//4096))
    out = []
    for s in range(S):
        ulo, uhi = seg_bounds(uo, s, Nu); vlo, vhi = seg_bounds(vo, s, Nv); na, nb = uhi-ulo, vhi-vlo
        cu, cv = (na+C-1)//C, (nb+C-1)//C; t = 0.0
        for c in range(C):
            for k in range(cu):
                i = c*cu+k
                if i < na: t += cost[ulo+i]
            for k in range(cv):
                j = c*cv+k
                if j < nb: t += cost[Nu+vlo+j]
        out.append(float('nan') if na == 0 or nb == 0 else t/(na*nb))
    return out, up, vp

def block_path(u, v, uo, vo, key, CAP):
    S = len(uo)-1; Nu, Nv = len(u), len(v); out = []
    up = [None]*Nu; vp = [None]*Nv
    for s in range(S):
        ulo, uhi = seg_bounds(uo, s, Nu); vlo, vhi = seg_bounds(vo, s, Nv); na, nb = uhi-ulo, vhi-vlo
        if na > CAP or nb > CAP:
            out.append(float('nan')); continue
        def bsort(x, lo, n, perm):
            keys = [key(x[lo+li]) if li < n else (2**(32 if key is key32 else 64)-1) for li in range(CAP)]
            idx = sorted(range(CAP), key=lambda li: keys[li])
            srt = []
            for r in range(n): perm[lo+r] = lo+idx[r]; srt.append(x[lo+idx[r]])
            return srt
        sa = bsort(u, ulo, na, up); sb = bsort(v, vlo, nb, vp)
        if na == 0 or nb == 0: out.append(float('nan')); continue
        t = 0.0
        if na >= nb:
            for i in range(na):
                jl, jh = overlap_range(i, na, nb)
                t += sum(overlap_weight(i, j, na, nb)*(sa[i]-sb[j])**2 for j in range(jl, jh+1))
        else:
            for j in range(nb):
                il, ih = overlap_range(j, nb, na)
                t += sum(overlap_weight(j, i, nb, na)*(sb[j]-sa[i])**2 for i in range(il, ih+1))
        out.append(t/(na*nb))
    return out, up, vp

def check(u, v, uo, vo, dtype):
    key = key32 if dtype == torch.float32 else key64
    ut = torch.tensor(u, dtype=dtype); vt = torch.tensor(v, dtype=dtype)
    w, upc, vpc = torch.ops.entangle_ext.wasserstein2_1d(ut, vt, torch.tensor(uo), torch.tensor(vo), -1)
    uu = [float(x) for x in ut]; vv = [float(x) for x in vt]
    for name, res in (("device", device_path(uu, vv, uo, vo, key)),
                      ("device C=3", device_path(uu, vv, uo, vo, key, C=3)),
                      ("block", block_path(uu, vv, uo, vo, key, 128))):
        o, up, vp = res
        np.testing.assert_allclose(o, w.double().numpy(), rtol=1e-5, atol=1e-9, err_msg=name)
        assert up == upc.tolist() and vp == vpc.tolist(), (name, up, upc.tolist(), vp, vpc.tolist())

rng = np.random.default_rng(0)
n_cases = 0
for trial in range(300):
    S = int(rng.integers(1, 6))
    lu = rng.integers(0, 12, S); lv = rng.integers(0, 12, S)
    if trial % 3 == 0: lu = np.maximum(lu, 1); lv = np.maximum(lv, 1)
    uo = [0] + np.cumsum(lu).tolist(); vo = [0] + np.cumsum(lv).tolist()
    dtype = torch.float32 if trial % 2 else torch.float64
    def draw(n):
        x = rng.integers(-3, 4, n).astype(float)  # heavy ties
        if trial % 5 == 0 and n > 0:
            x[rng.integers(0, n)] = -0.0
            x[rng.integers(0, n)] = 0.0
        if trial % 7 == 0 and n > 0:
            x[rng.integers(0, n)] = float('nan')
        if trial % 11 == 0 and n > 0:
            x[rng.integers(0, n)] = float('inf')
        return x.tolist()
    check(draw(uo[-1]), draw(vo[-1]), uo, vo, dtype); n_cases += 1
print("W2 emulation matches CPU op on", n_cases, "cases")
