# A model check of flash_attention_sm90.cu's synchronization: the loader and the two
# multiplying warpgroups of one persistent block as generators under random interleavings,
# with mbarrier parity semantics, the named-barrier turns and asynchronous TMA completion; it
# asserts that no stage is overwritten while read, that every read finds the tile it expects,
# and that nothing deadlocks, over random varlen batches, head counts and grids.
# Tried by hand: each mutation (a wait two slots back made three, a skipped release, no first
# turn) makes it fail.
# Usage: python3 tools/fa_protocol.py [seeds]
import random, sys
BM = BN = 128

class MBar:
    def __init__(s, count): s.count, s.pending, s.phase, s.tx = count, count, 0, 0
    def arrive(s):
        s.pending -= 1
        assert s.pending >= 0
        s._maybe()
    def _maybe(s):
        if s.pending == 0 and s.tx == 0:
            s.phase += 1; s.pending = s.count
    def done(s, parity): return (s.phase & 1) != parity

class Named:
    def __init__(s): s.arrived = 0; s.gen = 0
    # returns generation to wait on
    def arrive(s):
        s.arrived += 1
        assert s.arrived <= 2, "named barrier over-arrived"
        if s.arrived == 2: s.arrived = 0; s.gen += 1

def items_of(tokens, heads, seq_start):
    q_tiles = (tokens + BM - 1) // BM
    out = []
    for i in range(q_tiles * heads):
        q0 = (q_tiles - 1 - i // heads) * BM; h = i % heads
        qlast = min(q0 + BM, tokens) - 1; kstart = seq_start[q0]
        out.append((q0, h, qlast, kstart, (qlast - kstart) // BN + 1))
    return out

def run(tokens, heads, seq_start, grid, block, seed):
    rnd = random.Random(seed)
    items = items_of(tokens, heads, seq_start)
    mine = list(range(block, len(items), grid))
    q_full = [MBar(1) for _ in range(2)]; q_empty = [MBar(2) for _ in range(2)]
    k_full = [MBar(1) for _ in range(2)]; v_full = [MBar(1) for _ in range(2)]
    k_empty = [MBar(2) for _ in range(2)]; v_empty = [MBar(2) for _ in range(2)]
    named = {1: Named(), 2: Named()}
    content = {('q', b): None for b in range(2)}
    for b in range(2): content[('k', b)] = content[('v', b)] = None
    readers = {key: set() for key in content}
    inflight = []  # (key, tag, bar)
    def wait_slot(bars, slot):
        b = bars[slot & 1]; par = (slot >> 1) & 1
        while not b.done(par): yield
    def load(key, tag, bar):
        assert not readers[key], f"overwrite {key} while read by {readers[key]}"
        bar.tx += 1; bar.arrive()  # expect + arrival
        content[key] = ('loading', tag); inflight.append((key, tag, bar))
    def producer():
        slot = 0
        for j, i in enumerate(mine):
            q0, h, qlast, kstart, nt = items[i]
            if j >= 2: yield from wait_slot(q_empty, j - 2)
            load(('q', j & 1), ('q', i), q_full[j & 1])
            def ld(kind, fulls, emptys, at, n):
                if at >= 2: yield from wait_slot(emptys, at - 2)
                load((kind, at & 1), (kind, i, n), fulls[at & 1])
            yield from ld('k', k_full, k_empty, slot, 0)
            for n in range(nt):
                if n + 1 < nt: yield from ld('k', k_full, k_empty, slot + n + 1, n + 1)
                yield from ld('v', v_full, v_empty, slot + n, n)
            slot += nt
    def consumer(m):
        who = ('wg', m)
        def turn_sync():
            nb = named[1 + m]; g = nb.gen; nb.arrive()
            while nb.gen == g: yield
        def their():
            named[2 - m].arrive()
        def read(key, tag):
            assert content[key] == ('ready', tag), f"{who} reads {key}={content[key]} want {tag}"
            readers[key].add(who)
        def rel(key, bars, slot):
            readers[key].discard(who); bars[slot & 1].arrive()
        if m == 1: named[1].arrive()
        slot = 0
        for j, i in enumerate(mine):
            q0, h, qlast, kstart, nt = items[i]
            wg_last = min(q0 + m * 64 + 63, qlast)
            vis = min(nt, (wg_last - kstart) // BN + 1)
            assert vis >= nt - 1 and vis >= 1
            yield from wait_slot(q_full, j); read(('q', j & 1), ('q', i))
            yield from wait_slot(k_full, slot)
            yield from turn_sync(); read(('k', slot & 1), ('k', i, 0)); their()
            yield; rel(('k', slot & 1), k_empty, slot)
            for n in range(vis - 1):
                yield from wait_slot(k_full, slot + n + 1)
                yield from wait_slot(v_full, slot + n)
                yield from turn_sync()
                read(('k', (slot + n + 1) & 1), ('k', i, n + 1)); read(('v', (slot + n) & 1), ('v', i, n))
                their(); yield
                rel(('k', (slot + n + 1) & 1), k_empty, slot + n + 1); yield
                rel(('v', (slot + n) & 1), v_empty, slot + n)
            n = vis - 1
            yield from wait_slot(v_full, slot + n)
            yield from turn_sync(); read(('v', (slot + n) & 1), ('v', i, n)); their(); yield
            rel(('v', (slot + n) & 1), v_empty, slot + n)
            readers[('q', j & 1)].discard(who); q_empty[j & 1].arrive()
            for n in range(vis, nt):
                yield from wait_slot(k_full, slot + n); 
                assert content[('k', (slot + n) & 1)] == ('ready', ('k', i, n))
                k_empty[(slot + n) & 1].arrive()
                yield from wait_slot(v_full, slot + n)
                assert content[('v', (slot + n) & 1)] == ('ready', ('v', i, n))
                v_empty[(slot + n) & 1].arrive()
                yield from turn_sync(); their()
            slot += nt
    actors = [producer(), consumer(0), consumer(1)]
    alive = list(actors); steps = 0; stuck = 0
    while alive or inflight:
        steps += 1
        if inflight and (rnd.random() < 0.3 or not alive):
            key, tag, bar = inflight.pop(rnd.randrange(len(inflight)))
            content[key] = ('ready', tag); bar.tx -= 1; bar._maybe(); continue
        if not alive: continue
        a = rnd.choice(alive)
        try: next(a)
        except StopIteration: alive.remove(a)
        if steps > 2_000_000: raise RuntimeError("deadlock (no progress)")
    return steps

if __name__ == "__main__":
    cases = 0
    for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 300):
        r = random.Random(seed)
        tokens = r.randrange(1, 900)
        # sequences laid end to end
        starts = []; pos = 0
        while pos < tokens:
            L = r.randrange(1, 400); starts.append((pos, min(tokens, pos + L))); pos += L
        seq_start = [0] * tokens
        for a, b in starts:
            for t in range(a, b): seq_start[t] = a
        heads = r.choice([1, 2, 4])
        grid = r.choice([1, 2, 3, 5])
        for block in range(grid):
            run(tokens, heads, seq_start, grid, block, seed * 7 + block); cases += 1
    print("ok", cases)
