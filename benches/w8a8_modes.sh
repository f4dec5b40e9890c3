#!/usr/bin/env bash
# docs/performance.md "W8A8 on the 8-bit tensor cores": per-token NLLs of `--dtype bf16` and
# `w8a8` against `--dtype f32` on the 8B W8A8 synths (NLL_SCHEMES; `eval --rows ROWS`), then
# `bench` of each scheme:dtype of CONFIGS, alternating, REPEAT times, at the same batch (BATCH
# sequences of 2,048). Prints the table last.
#   [ROWS=8 BATCH=4 REPEAT=3 NLL_SCHEMES="fp8-dynamic w8a8-int8 fp8-block" CONFIGS="..."]
#   benches/w8a8_modes.sh QUANTPPL TOKENIZER TEXT OUT
set -u
Q=$1; TOK=$2; TEXT=$3; OUT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
NLL_SCHEMES=${NLL_SCHEMES-fp8-dynamic w8a8-int8 fp8-block}
CONFIGS=${CONFIGS:-fp8-dynamic:w8a8 fp8-dynamic:bf16 w8a8-int8:w8a8 w8a8-int8:bf16 fp8-block:w8a8 fp8-block:bf16 w4a16-g128:bf16 dense-bf16:bf16}
for scheme in $NLL_SCHEMES $(for c in $CONFIGS; do echo ${c%%:*}; done | sort -u); do
  [ -d /tmp/m8-$scheme ] || $Q synth --shape llama3-8b --scheme $scheme --seed 0 --out /tmp/m8-$scheme -q
done
ARGS="--method exl3 --ctx 2048 --stride 512 --rows ${ROWS:-8} --backend cuda -q"
for scheme in $NLL_SCHEMES; do
  for d in f32 bf16 w8a8; do
    $Q eval --model /tmp/m8-$scheme --tokenizer $TOK --data $TEXT $ARGS --dtype $d --dump-nll $OUT/nll_${scheme}_$d.jsonl --json $OUT/eval_${scheme}_$d.json > /dev/null 2> $OUT/eval_${scheme}_$d.err || tail -2 $OUT/eval_${scheme}_$d.err
  done
  echo "$scheme per token vs f32 (bf16, then w8a8):"
  python3 "$HERE/nll_compare.py" $OUT/nll_${scheme}_f32.jsonl $OUT/nll_${scheme}_bf16.jsonl $OUT/nll_${scheme}_w8a8.jsonl
done
for r in $(seq ${REPEAT:-3}); do
  for cfg in $CONFIGS; do
    scheme=${cfg%%:*}; d=${cfg##*:}; tag=${scheme}_${d}_b${BATCH:-4}_$r
    $Q bench --model /tmp/m8-$scheme --backend cuda --ctx 2048 --batch ${BATCH:-4} --iters 3 --dtype $d --json $OUT/$tag.json > $OUT/$tag.log 2>&1 || tail -2 $OUT/$tag.log
  done
done
python3 - $OUT ${BATCH:-4} $CONFIGS <<'PY'
import glob, json, statistics, sys
out, batch, configs = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"| scheme | --dtype | tokens/s at batch {batch} x 2048 (median; runs) | peak memory |")
for cfg in configs:
    s, d = cfg.split(":")
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{s}_{d}_b{batch}_*.json"))]
    tps = [r["tokens_per_second"] for r in runs]
    mem = max((r.get("peak_device_memory_bytes") or 0) for r in runs) / 2**30 if runs else 0
    print(f"| {s} | {d} | {statistics.median(tps):,.0f} ({', '.join(f'{t:,.0f}' for t in tps)}) | {mem:.2f} GiB |")
PY
