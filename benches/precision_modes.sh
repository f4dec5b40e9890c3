#!/usr/bin/env bash
# docs/performance.md "Precision modes, one GPU": bench of each `--dtype` on a synthetic
# checkpoint (default Llama-3-8B W4A16-g128), alternating REPEAT times, then each mode's
# per-token NLLs over `eval --rows ROWS` against transformers in float32 (upcast) on the same
# windows. Prints the table's rows last.
#   [SHAPE=.. SCHEME=.. REPEAT=5 ROWS=4] benches/precision_modes.sh QUANTPPL TOKENIZER TEXT OUT
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; REPEAT=${REPEAT:-5}; ROWS=${ROWS:-4}
HERE=$(cd "$(dirname "$0")" && pwd)
M=${WORK:-/tmp}/quantppl-bench/$SHAPE-$SCHEME
mkdir -p "$OUT" "$(dirname "$M")"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --seed 0 --out "$M" -q
MODES="bf16 f32-grade f32"
for r in $(seq "$REPEAT"); do
    for m in $MODES; do
        "$Q" bench --model "$M" --backend cuda --ctx 2048 --batch 4 --iters 3 --dtype "$m" \
            --json "$OUT/bench_${m}_$r.json" > "$OUT/bench_${m}_$r.log" 2>&1
    done
done
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
for m in $MODES; do
    "$Q" eval --model "$M" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda --dtype "$m" \
        -q --dump-nll "$OUT/nll_$m.jsonl" --json "$OUT/eval_$m.json"
done
python3 "$HERE/transformers_compare.py" "$M" "$TOK" "$TEXT" --ctx 2048 --stride 512 \
    --rows "$ROWS" --batch 4 --dtype float32 --upcast --dump-nll "$OUT/nll_transformers.jsonl" \
    > "$OUT/transformers.json"
python3 "$HERE/nll_compare.py" "$OUT/nll_transformers.jsonl" $(for m in $MODES; do echo "$OUT/nll_$m.jsonl"; done) \
    > "$OUT/nll_compare.jsonl"
python3 - "$OUT" "$MODES" <<'PY'
import glob, json, statistics, sys
out, modes = sys.argv[1], sys.argv[2].split()
dist = [json.loads(l) for l in open(f"{out}/nll_compare.jsonl")]
tps = {m: statistics.median(json.load(open(p))["tokens_per_second"]
       for p in glob.glob(f"{out}/bench_{m}_*.json")) for m in modes}
print("| `--dtype` | tokens/s (median) | vs bf16 | per-token max / p99.9 / mean from transformers f32 |")
for m, d in zip(modes, dist):
    print(f"| `{m}` | {tps[m]:,.0f} | {tps[m] / tps['bf16']:.3f} | "
          f"{d['max']:.3g} / {d['p99.9']:.3g} / {d['mean']:.3g} |")
PY
