#!/usr/bin/env bash
# docs/performance.md "What compare's statistics cost": `eval --task` of a 4-choice task of
# ITEMS items (default 10,000; contexts of 40 words and choices of CHOICE_WORDS words, default 4,
# from the text, label 0)
# on a synthetic model (SHAPE default llama3-8b, SCHEME default w4a16-g128), RUNS times (default
# 2), on CUDA with --batch-tokens BATCH (default the binary's); the process's wall seconds.
#   benches/task_cost.sh QUANTPPL TOKENIZER TEXT OUT
set -uo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4; mkdir -p "$OUT"
SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; M=${WORK:-/tmp}/cc-$SHAPE-${SCHEME%%-g*}
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --seed 0 --out "$M" -q || exit 1
python3 - "$TEXT" "${ITEMS:-10000}" "${CHOICE_WORDS:-4}" > "$OUT/task.jsonl" <<'PY'
import json, sys
words = open(sys.argv[1], encoding="utf-8").read().split()
n = int(sys.argv[3])
for i in range(int(sys.argv[2])):
    at = (i * 97) % (len(words) - 40 - 4 * n)
    ctx = " ".join(words[at:at + 40])
    choices = [" ".join(words[at + 40 + n * k: at + 40 + n * (k + 1)]) for k in range(4)]
    print(json.dumps({"context": ctx, "choices": choices, "label": 0}))
PY
for r in $(seq "${RUNS:-2}"); do
  t0=$(date +%s.%N)
  "$Q" eval --model "$M" --tokenizer "$TOK" --task "$OUT/task.jsonl" --backend cuda -q \
    ${BATCH:+--batch-tokens "$BATCH"} --json "$OUT/task_$r.json" > "$OUT/task_$r.log" 2>&1 || tail -3 "$OUT/task_$r.log"
  t1=$(date +%s.%N)
  echo "run $r: $(python3 -c "print(round($t1 - $t0, 1))") s (batch ${BATCH:-default}), $(wc -l < "$OUT/task.jsonl") items, choices of ${CHOICE_WORDS:-4} words"
done
