#!/usr/bin/env bash
# docs/performance.md "DeepSeek sparse attention": `quantppl bench` of 2-layer slices of the
# deepseek-v3.2 synth shape (sparse attention: the indexer, then attention over its top 2048 keys
# a query) and of deepseek-v3 (the same layers, dense attention), one sequence of CTX tokens,
# bf16, median of ITERS batches; DeepSeek-V3.2's sparse attention in each of FORMS
# (`--sparse-latent-from`: 1000000 the expanded heads, 1 the latent space); prints per ctx the
# batch time, tokens/s, the seconds of attention, of sparse attention and of the indexer's
# selection from bench's per-op profile, and the peak device memory.
#   [SHAPES="deepseek-v3.2 deepseek-v3" SCHEME=dense-bf16 CTXS="4096 16384 65536" ITERS=3
#    FORMS="1000000 1" BACKEND=cuda]
#   benches/sparse_attention_ctx.sh QUANTPPL OUT
set -euo pipefail
Q=$1; OUT=$2
SHAPES=${SHAPES:-deepseek-v3.2 deepseek-v3}; CTXS=${CTXS:-4096 16384 65536}
SCHEME=${SCHEME:-dense-bf16}; FORMS=${FORMS:-1000000 1}
ITERS=${ITERS:-3}; BACKEND=${BACKEND:-cuda}; WORK=${WORK:-/tmp}/quantppl-bench
mkdir -p "$OUT" "$WORK"
for s in $SHAPES; do
    m="$WORK/$s-$SCHEME-2"
    [ -d "$m" ] || "$Q" synth --shape "$s" --scheme "$SCHEME" --layers 2 --out "$m" -q
done
# The kernels compiled before the timed runs.
"$Q" bench --model "$m" --backend "$BACKEND" --ctx 1024 --batch 1 --iters 1 > /dev/null 2>&1
for ctx in $CTXS; do
    for s in $SHAPES; do
        forms=0
        [ "$s" = deepseek-v3.2 ] && forms=$FORMS
        for f in $forms; do
            args=()
            [ "$f" = 0 ] || args=(--sparse-latent-from "$f")
            "$Q" bench --model "$WORK/$s-$SCHEME-2" --backend "$BACKEND" --ctx "$ctx" --batch 1 \
                --iters "$ITERS" "${args[@]}" --json "$OUT/bench_${s}_${ctx}_$f.json" \
                > "$OUT/bench_${s}_${ctx}_$f.log" 2>&1 || echo "$s ctx $ctx form $f failed"
        done
    done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
print(f"{'slice':<14}{'form':>9}{'ctx':>7}{'s/batch':>9}{'tok/s':>8}{'attention':>11}"
      f"{'sparse_attn':>12}{'index_top_k':>12}{'peak GiB':>9}")
rows = []
for f in glob.glob(f"{sys.argv[1]}/bench_*.json"):
    j = json.load(open(f))
    ops = {o["op"]: o["seconds"] for o in j["ops"]}
    _, name, ctx, form = os.path.basename(f)[:-5].split("_")
    form = {"0": "dense", "1": "latent"}.get(form, "expanded")
    rows.append((name, j["ctx"], form, j, ops))
for name, ctx, form, j, ops in sorted(rows, key=lambda r: (r[0], r[1], r[2])):
    peak = (j["peak_device_memory_bytes"] or 0) / 2**30
    print(f"{name:<14}{form:>9}{ctx:>7}{j['median_batch_seconds']:>9.3f}{j['tokens_per_second']:>8.0f}"
          f"{ops.get('attention', 0):>11.4f}{ops.get('sparse_attention', 0):>12.4f}"
          f"{ops.get('index_top_k', 0):>12.4f}{peak:>9.2f}")
PY
