#!/usr/bin/env bash
# What one device call runs for issue 53's GPU measurements, so that a session's device time
# goes to them at once. Here, before the call:
#   cargo build --release && strip -o /tmp/q target/release/quantppl && gzip -c /tmp/q > dist/q.gz
#   dist/lmw, for lmeval: cp312 wheels of lm_eval 0.4.13 and what it needs beyond the machine's
#   Python (torch, transformers, numpy, pandas, pyarrow, scipy, huggingface_hub are there):
#     cd dist/lmw && pip wheel --no-deps sqlitedict word2number rouge_score -w . &&
#     pip download lm_eval==0.4.13 --find-links . --python-version 3.12 --only-binary=:all: \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux_2_28_x86_64 -d . &&
#     rm numpy-* pandas-* pyarrow-* scipy-* huggingface_hub-* hf_xet-* pyyaml-* packaging-* \
#       jinja2-* markupsafe-* filelock-* httpx2-* httpcore2-* h11-* anyio-* setuptools-* &&
#     pip download --no-deps compressed-tensors==0.20.0 pydantic pydantic-core annotated-types \
#       typing-inspection loguru accelerate tenacity --python-version 3.12 --only-binary=:all: \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .
#   tools/device_tree.sh slim; then the device tool's run with carry ["dist/q.gz", "dist/lmw"]
#   and the command `bash tools/device_run.sh STAGE`; tools/device_tree.sh restore after.
# Stages (each within one call's 10 minutes on an H200, the 8B W4A16 synth built by the first):
#   serve   benches/serve_vs_eval.sh (8 and 32 clients) and benches/prefix_cache.sh
#   lmeval  benches/lm_eval/gpu_vs_hf.sh (N items, PAGES wikitext pages, CACHES)
#   check   `quantppl check` of each fixture folder named after it (carried: name them in carry,
#           e.g. tests/fixtures/synth-mistral-large4-mini) in CUDA's bf16, f32 and f32-grade
# Results under $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?the device tool sets OUT}"
case "${1:-}" in serve | lmeval | check) ;; *) echo "usage: OUT=dir tools/device_run.sh serve | lmeval | check DIR..." >&2; exit 2 ;; esac
Q=/tmp/qp/quantppl
[ -x $Q ] || { mkdir -p /tmp/qp && gunzip -c dist/q.gz > $Q && chmod +x $Q; }
export WORK=/tmp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
case "${1:-}" in
serve)
    t0=$(date +%s)
    CLIENTS="8 32" REPEAT=3 bash benches/serve_vs_eval.sh $Q bundled "$OUT/serve_vs_eval" 2>&1 | tail -8
    echo "serve_vs_eval: $(($(date +%s) - t0)) s"
    t0=$(date +%s)
    CACHE_MB=16384 LAG=8 REPEAT=3 bash benches/prefix_cache.sh $Q bundled "$OUT/prefix_cache" 2>&1 | tail -6
    cat "$OUT/prefix_cache/rates.txt"
    echo "prefix_cache: $(($(date +%s) - t0)) s"
    ;;
check)
    shift
    for dtype in bf16 f32 f32-grade; do
        for dir in "$@"; do
            $Q check --backend cuda --dtype $dtype --op add --model "$dir" 2>&1 \
                | grep -E "^tests.* (ok|FAIL.*)$|rror" | sed "s/^/$dtype /"
        done
    done | tee "$OUT/check.txt"
    ;;
lmeval)
    t0=$(date +%s)
    WHEELS=dist/lmw N=${N:-3000} PAGES=${PAGES:-1000} CACHES="${CACHES:-0 16384}" \
        bash benches/lm_eval/gpu_vs_hf.sh $Q assets/stories260K "$OUT/lm_eval" 2>&1 | tail -30
    echo "lm_eval: $(($(date +%s) - t0)) s"
    ;;
esac
