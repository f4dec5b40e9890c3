#!/usr/bin/env bash
# docs/performance.md "Gemma 4 against transformers": a `--layers` slice of the Gemma 4 31B
# shape in W4A16 (five sliding layers and one full-attention layer of heads of 512) through
# quantppl and through transformers + compressed-tensors on the same exl3 windows, RUNS times
# each (medians in the table), at the same batch (4 windows of 2048) and quantppl at its own
# (sized from memory); then quantppl alone on the 26B-A4B shape's slice in NVFP4A16 (its widths,
# 2112 and 704, are not multiples of W4A16's group of 128; transformers 5.23 has no conversion
# for per-expert Gemma 4 checkpoints); last a `bench` of each (its op shares).
# Usage: [RUNS=3 ROWS=100 LAYERS=6 WHEELS=.whl] benches/gemma4_vs_transformers.sh \
#   QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
RUNS=${RUNS:-3}; ROWS=${ROWS:-100}; LAYERS=${LAYERS:-6}
WORK=${WORK:-/tmp/quantppl-bench}
mkdir -p "$WORK" "$OUT"
. "$(dirname "$0")/transformers_wheels.sh"
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
for SHAPE in gemma4-31b gemma4-26b-a4b; do
    SCHEME=w4a16-g128
    [ "$SHAPE" = gemma4-31b ] || SCHEME=nvfp4a16
    M="$WORK/$SHAPE-$SCHEME-$LAYERS"
    [ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --layers "$LAYERS" --out "$M" -q
    for r in $(seq "$RUNS"); do
        "$Q" eval --model "$M" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda \
            --batch-tokens 8192 -q --json "$OUT/$SHAPE-q-same-$r.json"
        "$Q" eval --model "$M" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda \
            -q --json "$OUT/$SHAPE-q-own-$r.json"
        [ "$SHAPE" = gemma4-31b ] || continue
        python3 "$(dirname "$0")/transformers_compare.py" "$M" "$TOK" "$TEXT" \
            --ctx 2048 --stride 512 --rows "$ROWS" --batch 4 > "$OUT/$SHAPE-t-$r.json"
    done
done
for M in "$WORK"/gemma4-*-"$LAYERS"; do
    "$Q" bench --model "$M" --backend cuda --ctx 2048 --batch 4 --iters 3
done
python3 - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
o, runs = sys.argv[1], int(sys.argv[2])
gib = 1 << 30
def med(shape, who, key):
    vals = [json.load(open(f"{o}/{shape}-{who}-{r}.json"))[key] for r in range(1, runs + 1)]
    return statistics.median(vals)
for shape in ["gemma4-31b", "gemma4-26b-a4b"]:
    print(f"== {shape} (medians of {runs})")
    for who, label in [("q-same", "quantppl, 8192-token batches"), ("q-own", "quantppl, own batch")]:
        print(f"{label:<34} PPL {med(shape, who, 'ppl'):.6f}  {med(shape, who, 'tokens_per_second'):>9.0f} tok/s"
              f"  peak {med(shape, who, 'peak_device_memory_bytes') / gib:.2f} GiB")
    if shape == "gemma4-31b":
        print(f"{'transformers, batch 4':<34} PPL {med(shape, 't', 'ppl'):.6f}  {med(shape, 't', 'tokens_per_second'):>9.0f} tok/s"
              f"  peak {med(shape, 't', 'peak_gpu_memory_bytes') / gib:.2f} GiB"
              f"  ({json.load(open(f'{o}/{shape}-t-1.json')).get('tool')})")
PY
