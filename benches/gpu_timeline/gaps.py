"""GPU busy and idle time in a cupti_trace.c trace, batch by batch.

Busy is the union of kernels, copies and memsets on any stream. A batch starts at each event
named MARK (default: the upload of 100 x 2,048 token ids, `copy1_819200`; a batch's targets
are the same size, so a batch spans several segments). For segment SEG (default 2): the idle
time by the pair of events around each gap, the largest gaps with the driver calls inside them
(traced with TRACE_API=1), and the time by kernel.

    SEG=7 python3 gaps.py trace.tsv
"""
import bisect
import collections
import os
import sys

events, calls = [], []
for line in open(sys.argv[1]):
    kind, start, end, _, name = line.rstrip("\n").split("\t", 4)
    (calls if kind == "D" else events).append((int(start), int(end), name))
events.sort()
calls.sort()


def busy_and_span(seg):
    busy, cur_start, cur_end = 0, seg[0][0], seg[0][0]
    for s, e, _ in seg:
        if s > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = s, e
        elif e > cur_end:
            cur_end = e
    return busy + cur_end - cur_start, seg[-1][1] - seg[0][0]


mark = os.environ.get("MARK", "copy1_819200")
starts = [s for s, _, n in events if n == mark] or [events[0][0]]
bounds = starts + [events[-1][1] + 1]
segments = [[x for x in events if bounds[i] <= x[0] < bounds[i + 1]] for i in range(len(starts))]
for i, seg in enumerate(segments):
    busy, span = busy_and_span(seg)
    print(f"segment {i}: span {span / 1e6:.1f} ms, busy {busy / 1e6:.1f} ms, idle {(span - busy) / 1e6:.1f} ms")

seg = segments[int(os.environ.get("SEG", "2"))]
gaps, counts, largest, by_kernel = collections.Counter(), collections.Counter(), [], collections.Counter()
cur_end, last = seg[0][1], seg[0][2]
for s, e, n in seg:
    by_kernel[n[:60]] += e - s
    if s > cur_end:
        key = (last[:50], n[:50])
        gaps[key] += s - cur_end
        counts[key] += 1
        largest.append((s - cur_end, cur_end, last[:50], n[:50]))
    if e >= cur_end:
        cur_end, last = e, n
print("idle by (before, after):")
for key, ns in gaps.most_common(15):
    print(f"  {ns / 1e6:8.2f} ms  n={counts[key]:5d}  {key[0]}  ->  {key[1]}")
print("largest gaps and the driver calls inside them:")
call_starts = [c[0] for c in calls]
for gap, at, before, after in sorted(largest, reverse=True)[:12]:
    inside = collections.Counter()
    for s, e, n in calls[bisect.bisect_left(call_starts, at - 2_000_000):]:
        if s > at + gap:
            break
        if e > at:
            inside[n] += min(e, at + gap) - max(s, at)
    top = ", ".join(f"{n} {ns / 1e3:.0f} us" for n, ns in inside.most_common(4))
    print(f"  {gap / 1e3:9.1f} us  {before} -> {after}  |  {top}")
print("time by kernel:")
for name, ns in by_kernel.most_common(20):
    print(f"  {ns / 1e6:8.2f} ms  {name}")
