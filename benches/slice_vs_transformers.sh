#!/usr/bin/env bash
# docs/performance.md's "... against transformers" tables on one GPU: a `--layers` slice of a
# synth SHAPE in SCHEME through quantppl (4 windows of 2048 a batch, and its own batch sized
# from memory) and through transformers (+ compressed-tensors; batch 4) on the same exl3
# windows, RUNS times each, medians printed. Where transformers cannot read SCHEME for the
# family, REF_SCHEME=dense-bf16 gives it the dense checkpoint of the same seed (the model
# compressed-tensors would decompress to, but for the quantization) and quantppl reads that one
# too, so that the two PPLs compare.
# Usage: [SHAPE=llama4-scout SCHEME=w4a16-g128 REF_SCHEME= LAYERS=4 RUNS=3 ROWS=60 WHEELS=.whl
#         MODEL=DIR]
#   benches/slice_vs_transformers.sh QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
SHAPE=${SHAPE:-llama4-scout}; SCHEME=${SCHEME:-w4a16-g128}; REF_SCHEME=${REF_SCHEME:-$SCHEME}
RUNS=${RUNS:-3}; ROWS=${ROWS:-60}; LAYERS=${LAYERS:-4}
WORK=${WORK:-/tmp/quantppl-bench}
mkdir -p "$WORK" "$OUT"
. "$(dirname "$0")/transformers_wheels.sh"
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
slice() {
    local m="$WORK/$SHAPE-$1-$LAYERS"
    [ -d "$m" ] || "$Q" synth --shape "$SHAPE" --scheme "$1" --layers "$LAYERS" --out "$m" -q >&2
    echo "$m"
}
# MODEL: a slice built elsewhere (a family `synth` has no shape for), read by both tools.
if [ -n "${MODEL:-}" ]; then M=$MODEL R=$MODEL; else M=$(slice "$SCHEME"); R=$(slice "$REF_SCHEME"); fi
evaluate() { "$Q" eval --model "$1" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda "${@:3}" -q --json "$2"; }
# A first run on a machine compiles the CUDA kernels (cached on disk for the next).
"$Q" bench --model "$M" --backend cuda --ctx 512 --batch 1 --iters 1 > /dev/null
for r in $(seq "$RUNS"); do
    evaluate "$M" "$OUT/q-same-$r.json" --batch-tokens 8192
    evaluate "$M" "$OUT/q-own-$r.json"
    [ "$R" = "$M" ] || evaluate "$R" "$OUT/q-ref-$r.json" --batch-tokens 8192
    python3 "$(dirname "$0")/transformers_compare.py" "$R" "$TOK" "$TEXT" \
        --ctx 2048 --stride 512 --rows "$ROWS" --batch 4 > "$OUT/t-$r.json"
done
python3 - "$OUT" "$RUNS" "$SHAPE" "$SCHEME" "$REF_SCHEME" <<'PY'
import json, os, statistics, sys
o, runs, shape, scheme, ref = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
gib = 1 << 30
def med(who, key):
    return statistics.median(json.load(open(f"{o}/{who}-{r}.json"))[key] for r in range(1, runs + 1))
print(f"== {shape} slice (medians of {runs}; transformers: {json.load(open(f'{o}/t-1.json'))['tool']})")
for who, label, mem in [("q-same", f"quantppl {scheme}, 8192-token batches", "peak_device_memory_bytes"),
                        ("q-own", f"quantppl {scheme}, own batch", "peak_device_memory_bytes"),
                        ("q-ref", f"quantppl {ref}, 8192-token batches", "peak_device_memory_bytes"),
                        ("t", f"transformers {ref}, batch 4", "peak_gpu_memory_bytes")]:
    if os.path.exists(f"{o}/{who}-1.json"):
        print(f"{label:<44} PPL {med(who, 'ppl'):.6f}  {med(who, 'tokens_per_second'):>9.0f} tok/s"
              f"  peak {med(who, mem) / gib:.2f} GiB")
PY
