#!/usr/bin/env bash
# docs/performance.md "INT8 W8A8 exact on the integer tensor cores": NEW's op checks and W8A8
# fixtures in each `--dtype` (run from the repository root, fixtures present), then the 8B INT8
# W8A8 synth in NEW against OLD (a binary that emulates INT8 W8A8): per-token NLLs against OLD's
# `f32` (`eval --rows 8`), and `bench` at the same batch (4 x 2,048) in bf16 (twice),
# f32-grade and f32, alternating.
#   benches/int8_exact.sh OLD NEW TOKENIZER TEXT OUT
set -u
O=$1; Q=$2; TOK=$3; TEXT=$4; OUT=$5
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for d in bf16 f32 f32-grade w8a8; do
  echo "== op linear $d: $($Q check --backend cuda --dtype $d --op linear 2>&1 | grep -E "FAIL|fail|checks|rror" | head -5)"
done
F="--model tests/fixtures/synth-ct-w8a8-int8 --model tests/fixtures/synth-llama-mini-fp8-dynamic"
for d in bf16 f32 f32-grade w8a8; do
  echo "== fixtures $d"; $Q check --backend cuda --dtype $d $F 2>&1 | grep -E "synth|FAIL|checks|rror|on cuda"
done
M=/tmp/m8-int8; $Q synth --shape llama3-8b --scheme w8a8-int8 --seed 0 --out $M -q
ARGS="--method exl3 --ctx 2048 --stride 512 --rows 8 --backend cuda -q"
for b in new old; do for d in f32 bf16; do
  bin=$Q; [ $b = old ] && bin=$O
  $bin eval --model $M --tokenizer $TOK --data $TEXT $ARGS --dtype $d --dump-nll $OUT/nll_${b}_$d.jsonl --json $OUT/eval_${b}_$d.json > /dev/null 2> $OUT/eval_${b}_$d.err || tail -2 $OUT/eval_${b}_$d.err
done; done
echo "per token vs the previous binary's f32 (new f32, new bf16, old bf16):"
python3 "$HERE/nll_compare.py" $OUT/nll_old_f32.jsonl $OUT/nll_new_f32.jsonl $OUT/nll_new_bf16.jsonl $OUT/nll_old_bf16.jsonl
for r in 1 2; do for d in bf16 f32-grade f32; do for b in new old; do
  [ $d = bf16 ] || [ $r = 1 ] || continue
  bin=$Q; [ $b = old ] && bin=$O
  $bin bench --model $M --backend cuda --ctx 2048 --batch 4 --iters 3 --dtype $d --json $OUT/b_${b}_${d}_$r.json > $OUT/b_${b}_${d}_$r.log 2>&1 || tail -2 $OUT/b_${b}_${d}_$r.log
  echo "$b $d run $r: $(grep -o '"tokens_per_second": *[0-9]*' $OUT/b_${b}_${d}_$r.json) peak $(grep -o '"peak_device_memory_bytes": *[0-9]*' $OUT/b_${b}_${d}_$r.json)"
done; done; done
