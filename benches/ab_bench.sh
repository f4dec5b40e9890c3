#!/usr/bin/env bash
# Two quantppl binaries side by side in one machine start (a change against its base):
# `checks`: every op check in every CUDA precision and on wgpu, and `check --model` of each
# folder under tests/fixtures present (bf16, f32-grade), compared number for number; `bench`:
# the 8B W4A16 synth (SHAPE, SCHEME to change it) alternating, bf16 three times and f32-grade
# twice. Prints a table last. On the GPU machine, Vulkan needs the loader packages in .gl/.
# `fixtures`: `check --model` of every fixture with a reference (tests/fixtures, assets) on
# BACKEND (default cpu), both binaries' model JSON compared; no GPU needed.
#   benches/ab_bench.sh OLD_BINARY NEW_BINARY OUT_DIR checks|bench|fixtures
# VARS_ALIAS="NEW->OLD" compares a case whose label the new binary renamed.
set -uo pipefail
OLD=$1; NEW=$2; OUT=$3; MODE=${4:-checks}; mkdir -p "$OUT"
export XDG_CACHE_HOME=/tmp/qcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
NVIDIA_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$NVIDIA_ICD" ] && export VK_DRIVER_FILES=$NVIDIA_ICD
: > "$OUT/table.txt"
cmp_json() { python3 - "$1" "$2" "$3" >> "$OUT/table.txt" <<'PY'
import json, sys
import os
tag, a, b = sys.argv[1], *(json.load(open(p)) for p in sys.argv[2:4])
new, _, old = os.environ.get("VARS_ALIAS", "->").partition("->")
def label(v): return v.replace(new, old) if new else v
# By op and shapes: a backend's name may change between binaries.
def ops(d): return {(i, c["name"], label(c["vars"])): (c["max_abs_err"], c["passed"]) for i, r in enumerate(d["op_runs"]) for c in r["ops"]}
oa, ob = ops(a), ops(b)
same = sum(oa[k] == ob.get(k) for k in oa)
fail = sum(not v[1] for v in ob.values())
ma = json.dumps(a.get("models"), sort_keys=True); mb = json.dumps(b.get("models"), sort_keys=True)
print(f"{tag}: cases old {len(oa)} new {len(ob)} identical {same} new-failing {fail}; models identical {ma == mb}")
PY
}
if [ "$MODE" = checks ]; then
for be_dt in "cuda bf16" "cuda f32" "cuda f32-grade" "wgpu auto"; do
  set -- $be_dt; be=$1; dt=$2
  for v in old new; do
    [ $v = old ] && bin=$OLD || bin=$NEW
    t0=$(date +%s)
    $bin check --backend $be --dtype $dt --json "$OUT/ops_${v}_${be}_${dt}.json" > "$OUT/ops_${v}_${be}_${dt}.log" 2>&1
    echo "ops $v $be $dt rc=$? $(( $(date +%s)-t0 ))s" >> "$OUT/table.txt"
  done
  cmp_json "ops $be $dt" "$OUT/ops_old_${be}_${dt}.json" "$OUT/ops_new_${be}_${dt}.json"
done
for m in tests/fixtures/*/; do n=$(basename $m); [ -f $m/reference.json ] || continue
  for dt in bf16 f32-grade; do
    for v in old new; do [ $v = old ] && bin=$OLD || bin=$NEW; $bin check --backend cuda --dtype $dt --op add --model $m --json "$OUT/m_${v}_${n}_$dt.json" > "$OUT/m_${v}_${n}_$dt.log" 2>&1; done
    cmp_json "model $n $dt" "$OUT/m_old_${n}_$dt.json" "$OUT/m_new_${n}_$dt.json"
  done
done
fi
if [ "$MODE" = fixtures ]; then
same=0; differ=""
for m in tests/fixtures/*/ assets/*/; do n=$(basename $m); [ -f $m/reference.json ] || continue
  for v in old new; do [ $v = old ] && bin=$OLD || bin=$NEW
    $bin check --backend "${BACKEND:-cpu}" --op add --model $m --json "$OUT/f_${v}_$n.json" > /dev/null 2>&1; done
  if python3 -c "import json,sys; a,b=(json.load(open(p))['models'] for p in sys.argv[1:]); sys.exit(0 if a == b and a else 1)" \
      "$OUT/f_old_$n.json" "$OUT/f_new_$n.json" 2>/dev/null; then same=$((same+1)); else differ="$differ $n"; fi
done
echo "fixtures on ${BACKEND:-cpu}: identical $same; different or failed:${differ:- none}" >> "$OUT/table.txt"
fi
if [ "$MODE" = bench ]; then
M=${WORK:-/tmp}/ab-${SHAPE:-llama3-8b}-${SCHEME:-w4a16-g128}
[ -d "$M" ] || $NEW synth --shape "${SHAPE:-llama3-8b}" --scheme "${SCHEME:-w4a16-g128}" --seed 0 --out "$M" -q || exit 1
bench() { "$1" bench --model $M --backend cuda --ctx 2048 --batch 4 --iters 3 --dtype $2 --json "$OUT/$3.json" > "$OUT/$3.log" 2>&1; python3 -c "import json;print('$3', round(json.load(open('$OUT/$3.json'))['tokens_per_second']))" >> "$OUT/table.txt"; }
for r in 1 2 3; do bench $OLD bf16 old_bf16_$r; bench $NEW bf16 new_bf16_$r; done
# f32-grade was called split-bf16 before session 31; the old name stays an alias.
for r in 1 2; do bench $OLD split-bf16 old_f32grade_$r; bench $NEW split-bf16 new_f32grade_$r; done
fi
cat "$OUT/table.txt"
