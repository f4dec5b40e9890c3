#!/usr/bin/env bash
# docs/performance.md "Gemma 4 against transformers": a `--layers` slice of the Gemma 4 31B
# shape in W4A16 (five sliding layers and one full-attention layer of heads of 512) through
# quantppl and through transformers + compressed-tensors on the same exl3 windows, RUNS times
# each (medians in the table), at the same batch (4 windows of 2048) and quantppl at its own
# (sized from memory); then the 26B-A4B shape's slice: quantppl on it in NVFP4A16 (its widths,
# 2112 and 704, are not multiples of W4A16's group of 128), and both tools on its dense bf16
# slice with the experts stacked as transformers reads them (benches/stack_experts.py:
# transformers has no conversion for per-expert Gemma 4 checkpoints, quantized or not); last a
# `bench` of each slice (its op shares), after the table. SHAPES picks the shapes.
# Usage: [RUNS=3 ROWS=100 LAYERS=6 WHEELS=.whl SHAPES="gemma4-31b gemma4-26b-a4b"] \
#   benches/gemma4_vs_transformers.sh QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
RUNS=${RUNS:-3}; ROWS=${ROWS:-100}; LAYERS=${LAYERS:-6}
WORK=${WORK:-/tmp/quantppl-bench}
mkdir -p "$WORK" "$OUT"
. "$(dirname "$0")/transformers_wheels.sh"
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
SHAPES=${SHAPES:-gemma4-31b gemma4-26b-a4b}
evaluate() {
    "$Q" eval --model "$1" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda -q \
        --json "$2" "${@:3}"
}
compare() {
    python3 "$(dirname "$0")/transformers_compare.py" "$1" "$TOK" "$TEXT" \
        --ctx 2048 --stride 512 --rows "$ROWS" --batch 4 > "$2"
}
for SHAPE in $SHAPES; do
    SCHEME=w4a16-g128
    [ "$SHAPE" = gemma4-31b ] || SCHEME=nvfp4a16
    M="$WORK/$SHAPE-$SCHEME-$LAYERS"
    [ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --layers "$LAYERS" --out "$M" -q
    STACKED="$WORK/$SHAPE-stacked-bf16-$LAYERS"
    if [ "$SHAPE" != gemma4-31b ] && [ ! -d "$STACKED" ]; then
        "$Q" synth --shape "$SHAPE" --scheme dense-bf16 --layers "$LAYERS" --out "$WORK/dense" -q
        python3 "$(dirname "$0")/stack_experts.py" "$WORK/dense" "$STACKED"
        rm -rf "$WORK/dense"
    fi
    # A first run on a machine compiles the CUDA kernels (cached on disk for the next).
    "$Q" bench --model "$M" --backend cuda --ctx 512 --batch 1 --iters 1 > /dev/null
    for r in $(seq "$RUNS"); do
        evaluate "$M" "$OUT/$SHAPE-q-same-$r.json" --batch-tokens 8192
        evaluate "$M" "$OUT/$SHAPE-q-own-$r.json"
        if [ "$SHAPE" = gemma4-31b ]; then
            compare "$M" "$OUT/$SHAPE-t-$r.json"
        else
            evaluate "$STACKED" "$OUT/$SHAPE-q-bf16-$r.json" --batch-tokens 8192
            compare "$STACKED" "$OUT/$SHAPE-t-$r.json"
        fi
    done
done
python3 - "$OUT" "$RUNS" $SHAPES <<'PY'
import json, statistics, sys
o, runs, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
gib = 1 << 30
def med(shape, who, key):
    vals = [json.load(open(f"{o}/{shape}-{who}-{r}.json"))[key] for r in range(1, runs + 1)]
    return statistics.median(vals)
def row(label, shape, who, memory_key="peak_device_memory_bytes"):
    print(f"{label:<40} PPL {med(shape, who, 'ppl'):.6f}  {med(shape, who, 'tokens_per_second'):>9.0f} tok/s"
          f"  peak {med(shape, who, memory_key) / gib:.2f} GiB")
for shape in shapes:
    scheme = "W4A16" if shape == "gemma4-31b" else "NVFP4A16"
    print(f"== {shape} (medians of {runs})")
    row(f"quantppl {scheme}, 8192-token batches", shape, "q-same")
    row(f"quantppl {scheme}, own batch", shape, "q-own")
    if shape != "gemma4-31b":
        row("quantppl bf16 stacked, 8192-token batches", shape, "q-bf16")
    tool = json.load(open(f"{o}/{shape}-t-1.json")).get("tool")
    row(f"transformers, batch 4 ({tool})", shape, "t", "peak_gpu_memory_bytes")
PY
for SHAPE in $SHAPES; do
    for M in "$WORK/$SHAPE"-*-"$LAYERS"; do
        "$Q" bench --model "$M" --backend cuda --ctx 2048 --batch 4 --iters 3
    done
done
