#!/usr/bin/env bash
# docs/performance.md "Llama 4 against transformers": a `--layers` slice of the Llama-4-Scout
# shape in W4A16 (each layer 16 experts with the top-1 sigmoid on its input and a shared expert;
# the experts per expert as llm-compressor writes them, which transformers 5.23 +
# compressed-tensors 0.20 load) through quantppl and through transformers on the same exl3
# windows, RUNS times each (medians in the table): both at 4 windows of 2048 a batch, and
# quantppl at its own batch (sized from memory).
# Usage: [RUNS=3 ROWS=60 LAYERS=4 WHEELS=.whl] benches/llama4_vs_transformers.sh \
#   QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
RUNS=${RUNS:-3}; ROWS=${ROWS:-60}; LAYERS=${LAYERS:-4}
WORK=${WORK:-/tmp/quantppl-bench}
mkdir -p "$WORK" "$OUT"
. "$(dirname "$0")/transformers_wheels.sh"
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
M="$WORK/llama4-scout-w4a16-g128-$LAYERS"
[ -d "$M" ] || "$Q" synth --shape llama4-scout --scheme w4a16-g128 --layers "$LAYERS" --out "$M" -q
for r in $(seq "$RUNS"); do
    "$Q" eval --model "$M" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda \
        --batch-tokens 8192 -q --json "$OUT/q-same-$r.json"
    "$Q" eval --model "$M" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda \
        -q --json "$OUT/q-own-$r.json"
    python3 "$(dirname "$0")/transformers_compare.py" "$M" "$TOK" "$TEXT" \
        --ctx 2048 --stride 512 --rows "$ROWS" --batch 4 > "$OUT/t-$r.json"
done
python3 - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
o, runs = sys.argv[1], int(sys.argv[2])
gib = 1 << 30
def med(who, key):
    return statistics.median(json.load(open(f"{o}/{who}-{r}.json"))[key] for r in range(1, runs + 1))
print(f"== llama4-scout slice (medians of {runs})")
for who, label, mem in [("q-same", "quantppl, 8192-token batches", "peak_device_memory_bytes"),
                        ("q-own", "quantppl, own batch", "peak_device_memory_bytes"),
                        ("t", "transformers, batch 4", "peak_gpu_memory_bytes")]:
    print(f"{label:<30} PPL {med(who, 'ppl'):.6f}  {med(who, 'tokens_per_second'):>9.0f} tok/s"
          f"  peak {med(who, mem) / gib:.2f} GiB")
PY
