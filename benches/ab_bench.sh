#!/usr/bin/env bash
# Two quantppl binaries side by side in one machine start (a change against its base): `bench`
# of a synthetic checkpoint, alternating, bf16 three times and f32-grade twice, then each
# binary's `check` case list compared by name and shapes. Prints a table last.
#   benches/ab_bench.sh OLD_BINARY NEW_BINARY OUT_DIR   [SHAPE=llama3-8b SCHEME=w4a16-g128]
set -uo pipefail
OLD=$1; NEW=$2; OUT=$3; mkdir -p "$OUT"
M=${WORK:-/tmp}/ab-${SHAPE:-llama3-8b}-${SCHEME:-w4a16-g128}
[ -d "$M" ] || "$NEW" synth --shape "${SHAPE:-llama3-8b}" --scheme "${SCHEME:-w4a16-g128}" --seed 0 --out "$M" -q || exit 1
bench() {
    "$1" bench --model "$M" --backend cuda --ctx 2048 --batch 4 --iters 3 --dtype "$2" \
        --json "$OUT/$3.json" > "$OUT/$3.log" 2>&1
    python3 -c "import json; print('$3', round(json.load(open('$OUT/$3.json'))['tokens_per_second']))"
}
for r in 1 2 3; do bench "$OLD" bf16 "old_bf16_$r"; bench "$NEW" bf16 "new_bf16_$r"; done
# f32-grade was called split-bf16 before session 31; the old name stays an alias.
for r in 1 2; do bench "$OLD" split-bf16 "old_f32grade_$r"; bench "$NEW" split-bf16 "new_f32grade_$r"; done
for be in cuda wgpu; do
    "$OLD" check --backend $be --json "$OUT/old_check_$be.json" > /dev/null 2>&1
    "$NEW" check --backend $be --json "$OUT/new_check_$be.json" > /dev/null 2>&1
    python3 - "$OUT/old_check_$be.json" "$OUT/new_check_$be.json" <<'PY'
import json, sys
old, new = (json.load(open(p)) for p in sys.argv[1:3])
for ro, rn in zip(old["op_runs"], new["op_runs"]):
    a = {(c["name"], c["vars"]) for c in ro["ops"]}
    b = {(c["name"], c["vars"]) for c in rn["ops"]}
    failed = sum(not c["passed"] for c in rn["ops"])
    print(f"{rn['backend']}: old {len(a)} cases, new {len(b)}, only old {len(a - b)}, only new {len(b - a)}, new failing {failed}")
PY
done
