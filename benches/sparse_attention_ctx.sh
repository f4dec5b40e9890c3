#!/usr/bin/env bash
# docs/performance.md "DeepSeek sparse attention": `quantppl bench` of 2-layer slices of the
# deepseek-v3.2 synth shape (sparse attention: the indexer, then attention over its top 2048 keys
# a query) and of deepseek-v3 (the same layers, dense attention), one sequence of CTX tokens,
# bf16, median of ITERS batches; prints per ctx the batch time and the seconds of attention, of
# sparse attention and of the indexer's selection from bench's per-op profile.
#   [SHAPES="deepseek-v3.2 deepseek-v3" CTXS="4096 16384 65536" ITERS=3 BACKEND=cuda]
#   benches/sparse_attention_ctx.sh QUANTPPL OUT
set -euo pipefail
Q=$1; OUT=$2
SHAPES=${SHAPES:-deepseek-v3.2 deepseek-v3}; CTXS=${CTXS:-4096 16384 65536}
ITERS=${ITERS:-3}; BACKEND=${BACKEND:-cuda}; WORK=${WORK:-/tmp}/quantppl-bench
mkdir -p "$OUT" "$WORK"
for s in $SHAPES; do
    [ -d "$WORK/$s-2" ] || "$Q" synth --shape "$s" --scheme dense-bf16 --layers 2 --out "$WORK/$s-2" -q
done
for ctx in $CTXS; do
    for s in $SHAPES; do
        "$Q" bench --model "$WORK/$s-2" --backend "$BACKEND" --ctx "$ctx" --batch 1 --iters "$ITERS" \
            --json "$OUT/bench_${s}_$ctx.json" > "$OUT/bench_${s}_$ctx.log" 2>&1
    done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
print(f"{'slice':<16}{'ctx':>7}{'s/batch':>9}{'attention':>11}{'sparse_attn':>12}{'index_top_k':>12}")
for f in sorted(glob.glob(f"{sys.argv[1]}/bench_*.json")):
    j = json.load(open(f))
    ops = {o["op"]: o["seconds"] for o in j["ops"]}
    name = os.path.basename(f).split("_")[1]
    print(f"{name:<16}{j['ctx']:>7}{j['median_batch_seconds']:>9.3f}{ops.get('attention', 0):>11.4f}"
          f"{ops.get('sparse_attention', 0):>12.4f}{ops.get('index_top_k', 0):>12.4f}")
PY
