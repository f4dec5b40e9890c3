#!/usr/bin/env bash
# docs/performance.md "What compare's statistics cost": two quantppl binaries' `compare` of a
# synthetic model's W4A16-g128 against its dense BF16 (SHAPE, default llama3-8b), alternating,
# RUNS times each (default 3), on CUDA; tokens/s and wall seconds from each JSON, a table last.
#   benches/compare_cost.sh OLD NEW TOKENIZER TEXT OUT
# ROWS (default 32), CTX (default 2048), DTYPE (default the binary's), WORK (where the synths go).
set -uo pipefail
OLD=$1; NEW=$2; TOK=$3; TEXT=$4; OUT=$5; mkdir -p "$OUT"
SHAPE=${SHAPE:-llama3-8b}; W=${WORK:-/tmp}
BASE=$W/cc-$SHAPE-dense; QUANT=$W/cc-$SHAPE-w4a16
[ -d "$BASE" ] || "$NEW" synth --shape "$SHAPE" --scheme dense-bf16 --seed 0 --out "$BASE" -q || exit 1
[ -d "$QUANT" ] || "$NEW" synth --shape "$SHAPE" --scheme w4a16-g128 --seed 0 --out "$QUANT" -q || exit 1
: > "$OUT/table.txt"
for r in $(seq "${RUNS:-3}"); do
  for v in old new; do
    [ $v = old ] && bin=$OLD || bin=$NEW
    "$bin" compare --base "$BASE" "$QUANT" --tokenizer "$TOK" --data "$TEXT" --backend cuda \
      --ctx "${CTX:-2048}" --rows "${ROWS:-32}" ${DTYPE:+--dtype "$DTYPE"} -q \
      --json "$OUT/${v}_$r.json" > "$OUT/${v}_$r.log" 2>&1 || { echo "$v run $r failed"; tail -3 "$OUT/${v}_$r.log"; }
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], round(r['tokens_per_second']), round(r['wall_seconds'], 2))" \
      "$OUT/${v}_$r.json" $v $r >> "$OUT/table.txt" 2>/dev/null
  done
done
python3 - "$OUT/table.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for v in ("old", "new"):
    tps = [float(r[2]) for r in rows if r[0] == v]
    if tps:
        print(f"{v}: tokens/s {' '.join(str(int(t)) for t in tps)}, median {statistics.median(tps):.0f}")
PY
cat "$OUT/table.txt"
