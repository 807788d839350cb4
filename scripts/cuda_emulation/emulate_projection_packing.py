# Emulate projection.cu for_each_launch + slot mapping; check every chunk covered once, slots 0..nslots-1 written once
import random
kChunk=16384; kMax=320
NTs={2:48,4:36,8:24}
def for_each_launch(numels, KMAX):
    NT=NTs[KMAX]; launches=[]
    meta_numel=[None]*NT; meta_t=[None]*NT
    b2t=[None]*kMax; b2c=[None]*kMax
    nt=nb=0; slot_base=0
    def set_tensor(slot,t):
        assert 0<=slot<NT, slot
        meta_numel[slot]=numels[t]; meta_t[slot]=t
    for t,n in enumerate(numels):
        if n==0: continue
        set_tensor(nt,t); nt+=1
        nch=(n+kChunk-1)//kChunk
        for c in range(nch):
            b2t[nb]=nt-1; b2c[nb]=c; nb+=1
            last=c==nch-1
            if nb==kMax or (nt==NT and last):
                launches.append((slot_base,[(meta_t[b2t[b]],b2c[b]) for b in range(nb)]))
                slot_base+=nb; nb=0
                if last: nt=0
                else: set_tensor(0,t); nt=1
    if nb>0: launches.append((slot_base,[(meta_t[b2t[b]],b2c[b]) for b in range(nb)]))
    return launches
for trial in range(3000):
    K=random.choice([2,4,8]); T=random.randint(1,120)
    numels=[random.choice([0,1,5,kChunk-1,kChunk,kChunk+1,random.randint(0,5*kChunk), random.randint(0,400*kChunk) if random.random()<0.05 else 3]) for _ in range(T)]
    L=for_each_launch(numels,K)
    nslots=sum((n+kChunk-1)//kChunk for n in numels)
    slots=[]; chunks=[]
    for base,blocks in L:
        assert 0<len(blocks)<=kMax
        for b,(t,c) in enumerate(blocks):
            slots.append(base+b); chunks.append((t,c))
    assert slots==list(range(nslots)),(numels)
    exp=[(t,c) for t,n in enumerate(numels) for c in range((n+kChunk-1)//kChunk)]
    assert chunks==exp
print("projection launch packing OK")
