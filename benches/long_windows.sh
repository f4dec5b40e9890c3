#!/usr/bin/env bash
# docs/performance.md "Long windows": the 8B (Llama 3.1's shapes: llama3 rope scaling, 128k
# positions; W4A16-g128 unless SCHEME says otherwise) at ctx 2k, 8k, 32k and 128k with the same
# tokens in every batch (TOKENS, a 128k window's), `bench` on each BACKEND, REPEAT times
# alternating: tokens/s, peak device memory, and attention's share of a batch from bench's
# per-op profile. Then one `eval` at ctx 128k on TEXT (the whole path: windows, the lm_head's
# log-sum-exp in row blocks) with its peak memory. Prints the table last.
#   [SCHEME=w4a16-g128 TOKENS=131072 CTXS="2048 8192 32768 131072" REPEAT=3 BACKENDS="cuda wgpu"
#    ITERS=2] benches/long_windows.sh QUANTPPL TOKENIZER TEXT OUT
set -uo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
SCHEME=${SCHEME:-w4a16-g128}; TOKENS=${TOKENS:-131072}; REPEAT=${REPEAT:-3}; ITERS=${ITERS:-2}
CTXS=${CTXS:-2048 8192 32768 131072}; BACKENDS=${BACKENDS:-cuda wgpu}
M=${WORK:-/tmp}/quantppl-bench/llama3.1-8b-$SCHEME
mkdir -p "$OUT" "$(dirname "$M")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
[ -d "$M" ] || "$Q" synth --shape llama3.1-8b --scheme "$SCHEME" --seed 0 --out "$M" -q
for be in $BACKENDS; do
    for r in $(seq "$REPEAT"); do
        for ctx in $CTXS; do
            tag=${be}_${ctx}_$r
            "$Q" bench --model "$M" --backend "$be" --ctx "$ctx" --batch $((TOKENS / ctx)) \
                --iters "$ITERS" --json "$OUT/bench_$tag.json" > "$OUT/bench_$tag.log" 2>&1 ||
                tail -2 "$OUT/bench_$tag.log"
        done
    done
    # The eval's own windows: two of 128k on wiki.test.raw's 300k tokens (llama.cpp's plan).
    [ -n "${NO_EVAL:-}" ] || "$Q" eval --model "$M" --backend "$be" --tokenizer "$TOK" --data "$TEXT" --method llamacpp \
        --ctx 131072 --json "$OUT/eval_${be}.json" > "$OUT/eval_${be}.log" 2>&1 ||
        tail -2 "$OUT/eval_${be}.log"
done
python3 - "$OUT" "$REPEAT" "$TOKENS" "$BACKENDS" $CTXS <<'PY'
import json, os, statistics, sys
out, repeat, tokens, backends, ctxs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), [int(c) for c in sys.argv[5:]]
gib = lambda b: f"{b / 2**30:.2f} GiB" if b else "-"
print(f"| backend | ctx | sequences x ctx | tokens/s (median of {repeat}; runs) | attention share | peak device memory |")
print("| --- | --- | --- | --- | --- | --- |")
for be in backends:
    for ctx in ctxs:
        paths = [f"{out}/bench_{be}_{ctx}_{r}.json" for r in range(1, repeat + 1)]
        runs = [json.load(open(p)) for p in paths if os.path.exists(p)]
        if not runs:
            print(f"| {be} | {ctx:,} | {tokens // ctx} x {ctx:,} | failed | | |")
            continue
        tps = [r["tokens_per_second"] for r in runs]
        attn = sum(o["share"] for o in runs[0]["ops"] if "attention" in o["op"])
        mem = max(r.get("peak_device_memory_bytes") or 0 for r in runs)
        print(f"| {be} | {ctx:,} | {tokens // ctx} x {ctx:,} | {statistics.median(tps):,.0f} ({', '.join(f'{t:,.0f}' for t in tps)}) | {attn:.1%} | {gib(mem)} |")
for be in backends:
    p = f"{out}/eval_{be}.json"
    if os.path.exists(p):
        e = json.load(open(p))
        print(f"eval {be} ctx 131072 ({e['windows']} windows, batch {e['batch_tokens']} tokens): {json.dumps({k: e.get(k) for k in ('ppl', 'tokens_per_second', 'wall_seconds', 'peak_device_memory_bytes')})}")
    else:
        print(f"eval {be} ctx 131072: failed")
PY
