#!/usr/bin/env bash
# docs/performance.md's DeepSeek-V4 table on one GPU: a V4-Flash-shaped slice
# (benches/deepseek_v4_slice.py: LAYER_TYPES, default one compressed sparse and one heavily
# compressed layer) in bf16 and in V4's published format (FP4 experts), through quantppl
# (`bench` shares at ctx 2048 and, where the indexer chooses, 8192; exl3 windows of 2048 at
# 8,192-token batches and at its own batch) and through transformers on the bf16 weights
# (batch 4, its V4 needs transformers 5.23: WHEELS), RUNS times each, medians printed; each
# table line goes to OUT/v4.txt as it is known.
# Usage: [WHEELS=dist/tw RUNS=3 ROWS=20 LAYER_TYPES=a,b MLP_LAYER_TYPES=hash_moe,moe]
#   benches/deepseek_v4_vs_transformers.sh QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
RUNS=${RUNS:-3}; ROWS=${ROWS:-20}
LAYER_TYPES=${LAYER_TYPES:-compressed_sparse_attention,heavily_compressed_attention}
MLP_LAYER_TYPES=${MLP_LAYER_TYPES:-hash_moe,moe}
WORK=${WORK:-/tmp/quantppl-bench}
mkdir -p "$WORK" "$OUT"
. "$(dirname "$0")/transformers_wheels.sh"
BF16=$WORK/v4-flash-bf16 FP4=$WORK/v4-flash-fp4
t0=$(date +%s)
[ -d "$FP4" ] || python3 "$(dirname "$0")/deepseek_v4_slice.py" "$BF16" --fp4 "$FP4" \
    --layer-types "$LAYER_TYPES" --mlp-layer-types "$MLP_LAYER_TYPES" >&2
echo "slice built in $(($(date +%s) - t0)) s ($LAYER_TYPES; $MLP_LAYER_TYPES)" | tee "$OUT/v4.txt"
# A first run on a machine compiles the CUDA kernels (cached on disk for the next).
"$Q" bench --model "$FP4" --backend cuda --ctx 512 --batch 1 --iters 1 > /dev/null
for m in "$FP4 2048 4" "$BF16 2048 4" "$FP4 8192 1"; do
    set -- $m
    "$Q" bench --model "$1" --backend cuda --ctx "$2" --batch "$3" --iters 3 > "$OUT/bench-$(basename "$1")-$2.txt" 2>&1
    echo "bench $(basename "$1") ctx $2 x $3: $(grep -m1 -i "tokens/s" "$OUT/bench-$(basename "$1")-$2.txt")" | tee -a "$OUT/v4.txt"
done
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
evaluate() { "$Q" eval --model "$1" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda "${@:3}" -q --json "$2"; }
for r in $(seq "$RUNS"); do
    evaluate "$FP4" "$OUT/q-fp4-$r.json" --batch-tokens 8192
    evaluate "$FP4" "$OUT/q-fp4-own-$r.json"
    evaluate "$BF16" "$OUT/q-bf16-$r.json" --batch-tokens 8192
done
for r in $(seq "$RUNS"); do
    python3 "$(dirname "$0")/transformers_compare.py" "$BF16" "$TOK" "$TEXT" \
        --ctx 2048 --stride 512 --rows "$ROWS" --batch 4 > "$OUT/t-$r.json" || break
done
python3 - "$OUT" "$RUNS" <<'PY' | tee -a "$OUT/v4.txt"
import json, os, statistics, sys
o, runs = sys.argv[1], int(sys.argv[2])
gib = 1 << 30
def med(who, key):
    vals = [json.load(open(f"{o}/{who}-{r}.json"))[key] for r in range(1, runs + 1)
            if os.path.exists(f"{o}/{who}-{r}.json")]
    return statistics.median(vals), len(vals)
for who, label, mem in [("q-fp4", "quantppl FP4 experts, 8192-token batches", "peak_device_memory_bytes"),
                        ("q-fp4-own", "quantppl FP4 experts, own batch", "peak_device_memory_bytes"),
                        ("q-bf16", "quantppl bf16, 8192-token batches", "peak_device_memory_bytes"),
                        ("t", "transformers bf16, batch 4", "peak_gpu_memory_bytes")]:
    if os.path.exists(f"{o}/{who}-1.json"):
        (tps, n), (ppl, _), (peak, _) = med(who, "tokens_per_second"), med(who, "ppl"), med(who, mem)
        tool = json.load(open(f"{o}/{who}-1.json")).get("tool", "")
        print(f"{label:<42} PPL {ppl:.6f}  {tps:>9.0f} tok/s  peak {peak / gib:.2f} GiB  ({n} runs) {tool}")
    # transformers times its batches after an untimed one; quantppl's rate above includes its
    # first batch (one-time costs): its rate without it, where the batches are of one size.
    if who == "q-bf16" and os.path.exists(f"{o}/{who}-1.json"):
        rates = []
        for r in range(1, runs + 1):
            j = json.load(open(f"{o}/{who}-{r}.json"))
            w = j["device_times"][0]
            if w["batches"] > 1:
                later = j["tokens_forwarded_here"] * (w["batches"] - 1) / w["batches"]
                rates.append(later / (w["seconds"] - w["first_batch_seconds"]))
        if rates:
            print(f"{'  the same after its first batch':<42} {statistics.median(rates):>24.0f} tok/s")
PY
