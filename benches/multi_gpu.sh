#!/usr/bin/env bash
# The dense multi-GPU numbers of docs/archive/sessions-1-30.md (a host with 4 GPUs): the same exl3 eval of a
# synthetic Llama-3-8B W4A16 on 1, 2 and 4 GPUs (data parallel), and Llama-3-70B W4A16 on
# 1 GPU and with its layers split over 2. Usage: benches/multi_gpu.sh QUANTPPL TOKENIZER TEXT OUT
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4
WORK=${WORK:-/tmp/quantppl-bench}
mkdir -p "$WORK" "$OUT"
[ -d "$WORK/l8" ] || "$Q" synth --shape llama3-8b --scheme w4a16-g128 --out "$WORK/l8" &
[ -d "$WORK/l70" ] || "$Q" synth --shape llama3-70b --scheme w4a16-g128 --out "$WORK/l70" &
wait
common="--tokenizer $TOK --data $TEXT --method exl3 --ctx 2048 --stride 512 --backend cuda --batch-tokens 8192 -q"
for d in 0 0,1 0,1,2,3; do
    "$Q" eval --model "$WORK/l8" $common --rows 200 --devices $d --parallel data --json "$OUT/l8_${d//,/}.json"
done
"$Q" eval --model "$WORK/l70" $common --rows 96 --devices 0 --json "$OUT/l70_1.json"
"$Q" eval --model "$WORK/l70" $common --rows 96 --devices 0,1 --parallel layers --json "$OUT/l70_2.json"
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
rows = [("llama3-8b", "l8_0"), ("llama3-8b", "l8_01"), ("llama3-8b", "l8_0123"),
        ("llama3-70b", "l70_1"), ("llama3-70b", "l70_2")]
base = {}
print(f"{'model':<11} {'GPUs':>4} {'parallel':<22} {'PPL':>18} {'tokens/s':>9} {'speed-up':>8} {'load s':>7} {'peak GiB/GPU':>12}")
for m, f in rows:
    r = json.load(open(f"{o}/{f}.json"))
    base.setdefault(m, r["tokens_per_second"])
    print(f"{m:<11} {r['devices']:>4} {r['parallel']:<22} {r['ppl']:>18.10f} {r['tokens_per_second']:>9.0f} "
          f"{r['tokens_per_second']/base[m]:>8.2f} {r['load_seconds']:>7.1f} {r['peak_device_memory_bytes']/2**30:>12.2f}")
PY
