#!/usr/bin/env bash
# docs/performance.md "Hybrids": `quantppl bench` of a synthetic Qwen3.5 checkpoint (default
# the 35B-A3B's shapes, W4A16-g128) at ctx 2048, 8192 and 32768 with the same tokens per batch
# (TOKENS), each REPEAT times alternating; prints per ctx the median tokens/s and where a
# batch's time goes (the DeltaNet's ops, attention, everything else), from bench's per-op
# profile. A recurrent layer's cost per token stays flat as the window grows; attention's grows.
#   [SHAPE=.. SCHEME=.. LAYERS=.. TOKENS=32768 CTXS="2048 8192 32768" REPEAT=3 BACKEND=cuda]
#   benches/hybrid_ctx.sh QUANTPPL OUT
set -euo pipefail
Q=$1; OUT=$2
SHAPE=${SHAPE:-qwen3.5-35b-a3b}; SCHEME=${SCHEME:-w4a16-g128}; TOKENS=${TOKENS:-32768}
REPEAT=${REPEAT:-3}; BACKEND=${BACKEND:-cuda}; CTXS=${CTXS:-2048 8192 32768}
M=${WORK:-/tmp}/quantppl-bench/$SHAPE-$SCHEME${LAYERS:+-$LAYERS}
mkdir -p "$OUT" "$(dirname "$M")"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" ${LAYERS:+--layers "$LAYERS"} --seed 0 --out "$M" -q
for r in $(seq "$REPEAT"); do
    for ctx in $CTXS; do
        "$Q" bench --model "$M" --backend "$BACKEND" --ctx "$ctx" --batch $((TOKENS / ctx)) --iters 2 \
            --json "$OUT/bench_${ctx}_$r.json" > "$OUT/bench_${ctx}_$r.log" 2>&1
    done
done
python3 - "$OUT" "$REPEAT" $CTXS <<'PY'
import json, statistics, sys
out, repeat, ctxs = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3:]]
delta = {"linear_recurrence", "causal_conv", "gated_rms_norm"}
print("ctx     tokens/s (median)   DeltaNet ops   attention   the rest (share of a batch)")
for ctx in ctxs:
    runs = [json.load(open(f"{out}/bench_{ctx}_{r}.json")) for r in range(1, repeat + 1)]
    tps = statistics.median(r["tokens_per_second"] for r in runs)
    ops = runs[0]["ops"]
    share = lambda names: sum(o["share"] for o in ops if o["op"] in names)
    d, a = share(delta), share({"attention"})
    print(f"{ctx:<7} {tps:>17,.0f}   {d:>11.1%}   {a:>9.1%}   {1 - d - a:>8.1%}")
PY
