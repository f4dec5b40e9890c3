"""Per-token NLL differences between two runs of the same windows, for docs/performance.md.

usage: python3 nll_compare.py REFERENCE.jsonl OTHER.jsonl [OTHER.jsonl ...]

Each file is a `quantppl eval --dump-nll` dump or one of benches/transformers_compare.py's
(`--dump-nll`). Windows are matched by their input ids and positions by index (both score
position p against token p + 1); a window or position one file lacks is left out and counted.
Prints one JSON object per OTHER: the max, 99.9th percentile and mean |dNLL| and the relative
PPL difference over the positions both scored.
"""

import json
import math
import sys


def load(path):
    with open(path) as f:
        return {tuple(w["ids"]): dict(zip(w["positions"], w["nll"])) for w in map(json.loads, f)}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ref = load(sys.argv[1])
    for path in sys.argv[2:]:
        other = load(path)
        diffs, ref_sum, other_sum, unmatched = [], 0.0, 0.0, 0
        for ids, nll in ref.items():
            got = other.get(ids)
            if got is None:
                unmatched += len(nll)
                continue
            for p, v in nll.items():
                if p not in got:
                    unmatched += 1
                    continue
                diffs.append(abs(got[p] - v))
                ref_sum += v
                other_sum += got[p]
        if not diffs:
            sys.exit(f"{path}: no window in common with {sys.argv[1]}")
        diffs.sort()
        n = len(diffs)
        print(json.dumps({
            "reference": sys.argv[1],
            "other": path,
            "tokens": n,
            "unmatched": unmatched,
            "max": diffs[-1],
            "p99.9": diffs[min(n - 1, int(0.999 * n))],
            "mean": sum(diffs) / n,
            "rel_ppl": abs(math.exp((other_sum - ref_sum) / n) - 1),
        }))


if __name__ == "__main__":
    main()
