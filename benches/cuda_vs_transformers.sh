#!/usr/bin/env bash
# docs/performance.md "Against transformers" on one GPU: bench, and an exl3 eval of a synthetic
# checkpoint (default: Llama-3-8B W4A16) side by side with transformers + compressed-tensors on
# the same windows; DTYPE (e.g. w8a8 for the W8A8 schemes on the 8-bit tensor cores) is
# quantppl's --dtype. Usage: [SHAPE=qwen3-30b-a3b SCHEME=nvfp4a16 ROWS=200 LAYERS=4 DTYPE=w8a8
# SKIP_TRANSFORMERS=1]
#   benches/cuda_vs_transformers.sh QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}
WORK=${WORK:-/tmp/quantppl-bench}
M="$WORK/$SHAPE-$SCHEME${LAYERS:+-$LAYERS-layers}"
mkdir -p "$WORK" "$OUT"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" ${LAYERS:+--layers "$LAYERS"} --out "$M"
"$Q" bench --model "$M" --backend cuda ${DTYPE:+--dtype "$DTYPE"} --ctx 2048 --batch 4 --iters 5 --json "$OUT/bench_cuda.json"
ROWS=${ROWS:-200}
ARGS="--method exl3 --ctx 2048 --stride 512 --rows $ROWS"
"$Q" eval --model "$M" --tokenizer "$TOK" --data "$TEXT" $ARGS --backend cuda ${DTYPE:+--dtype "$DTYPE"} \
    --batch-tokens 8192 -q --json "$OUT/eval_cuda.json"
[ -n "${SKIP_TRANSFORMERS:-}" ] && exit 0
python3 "$(dirname "$0")/transformers_compare.py" "$M" "$TOK" "$TEXT" \
    --ctx 2048 --stride 512 --rows "$ROWS" --batch 4 > "$OUT/transformers.json"
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
q = json.load(open(f"{o}/eval_cuda.json")); t = json.load(open(f"{o}/transformers.json"))
gib = 1 << 30
print(f"{'':<28}{'quantppl cuda':>16}{'transformers':>16}{'ratio':>8}")
print(f"{'PPL':<28}{q['ppl']:>16.6f}{t['ppl']:>16.6f}{q['ppl']/t['ppl']:>8.5f}")
print(f"{'scored tokens':<28}{q['scored_tokens']:>16}{t['scored_tokens']:>16}")
print(f"{'tokens/s (eval)':<28}{q['tokens_per_second']:>16.0f}{t['tokens_per_second']:>16.0f}{q['tokens_per_second']/t['tokens_per_second']:>8.2f}")
print(f"{'peak GPU memory GiB':<28}{q['peak_device_memory_bytes']/gib:>16.2f}{t['peak_gpu_memory_bytes']/gib:>16.2f}{q['peak_device_memory_bytes']/t['peak_gpu_memory_bytes']:>8.2f}")
print(f"{'eval s (after load)':<28}{q['wall_seconds']-q['load_seconds']:>16.1f}{t['eval_seconds']:>16.1f}")
print(f"{'load s':<28}{q['load_seconds']:>16.1f}{t['load_and_decompress_seconds']:>16.1f}")
PY
