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
#   dist/tw and dist/tw2, for slices: cp312 wheels of transformers 5.23.0 with what it needs
#   beyond the machine's Python (tw), and of compressed-tensors alone (tw2, for the machine's own
#   transformers where it has both families):
#     cd dist/tw && pip download --no-deps transformers==5.23.0 huggingface_hub==2.4.0 \
#       tokenizers==0.23.3 safetensors==0.8.0 hf-xet==1.8.0 httpx2 httpcore2 truststore h11 anyio \
#       compressed-tensors==0.20.0 pydantic==2.14.4 pydantic_core==2.50.5 \
#       typing_extensions==4.16.0 typing-inspection==0.4.5 loguru==0.7.3 annotated-types \
#       --python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .
#     mkdir ../tw2 && cp compressed_tensors* pydantic* typing_* loguru* annotated* ../tw2/
#   tools/device_tree.sh slim; then the device tool's run with carry ["dist/q.gz", "dist/lmw"]
#   and the command `bash tools/device_run.sh STAGE`; tools/device_tree.sh restore after.
# Stages (each within one call's 10 minutes on an H200, the 8B W4A16 synth built by the first):
#   serve   benches/serve_vs_eval.sh (8 and 32 clients) and benches/prefix_cache.sh
#   lmeval  benches/lm_eval/gpu_vs_hf.sh (N items, PAGES wikitext pages, CACHES)
#   check   `quantppl check` of each fixture folder named after it (carried: name them in carry,
#           e.g. tests/fixtures/synth-mistral-large4-mini) in CUDA's bf16, f32 and f32-grade
#           (DTYPES overrides the list), and with OPS (e.g. "--op linear") those op checks;
#           VULKAN=1 (carry .gl) runs them through the GPU's Vulkan driver too
#   v4      `check --op sparse_attention --op streams --op mixture` and of the V4 fixtures
#           carried (tests/fixtures/synth-deepseek-v4-*) in bf16 and f32, then
#           benches/deepseek_v4_vs_transformers.sh: a 2-layer V4-Flash slice in bf16 and in V4's
#           FP4-expert format, quantppl's `bench` shares and eval against transformers 5.23 on
#           the bf16 weights; carry dist/tw and tests/fixtures/tokenizers/gpt2; the table to
#           v4.txt, the runs in v4.tgz
#   moe     issue 54's mixture: Qwen3-30B-A3B W4A16 against transformers at the same batch and
#           at each tool's best (carry dist/tw2 and tests/fixtures/tokenizers/gpt2): moe.txt
#   glm5next a GLM-5.3-Flash 2-layer slice (benches/glm5_next_slice.py; carry dist/tw and
#           tests/fixtures/tokenizers/gpt2): `bench` at ctx 2048, 8192, 32768, or with PART=eval
#           against transformers 5.23 (benches/slice_vs_transformers.sh), or with PART=forms the
#           KDA's chunked and step kernels at 4 and 8 windows: glm5next.txt
#   v4mix   `check --op streams` (bf16, f32) and `bench` of the V4-Flash slice in bf16 (carry
#           dist/tw): v4mix.txt
#   shadercore wgpu on the GPU's Vulkan with and without cooperative matrices (carry .gl):
#           `bench` op shares of the 8B's first 8 layers (W4A16 and BF16) and of Qwen3-0.6B
#           W4A16 on the shader-core kernels (QUANTPPL_DEV=wgpu-coop=off, each of TILES, e.g.
#           "default 16:16:16:32:32"), and of the BF16 8 layers in the one-product mode:
#           shadercore.txt
#   long    the 8B over one window of 131,072 tokens on the GPU's Vulkan (carry .gl and
#           tests/fixtures/tokenizers/gpt2): long.txt, eval_wgpu_${CTX:-131072}.json; with
#           BENCH=1 `bench`'s op shares of one such window instead
#   slices  Gemma 4's mixture (benches/gemma4_vs_transformers.sh) and a DeepSeek-V3.2 slice
#           (benches/slice_vs_transformers.sh) against transformers; carry dist/tw, dist/tw2 and
#           tests/fixtures/tokenizers/gpt2. The tables go to slices.txt, the runs' reports into
#           runs.tgz (a call brings back at most 8 files)
#   sparse  `check --op sparse_attention --op index_top_k` in CUDA's bf16, f32 and f32-grade,
#           `check` of each fixture folder named after it in bf16 and f32, then
#           benches/sparse_attention_ctx.sh
#           on a 2-layer DeepSeek-V3.2 W4A16 slice at windows of CTXS (default 4096 16384
#           65536), sparse attention over the expanded heads and in the latent space; the
#           tables to sparse.txt, the runs in sparse.tgz
#   profile Gemma 4's mixture (a LAYERS-layer slice, default 6, stacked bf16) through quantppl
#           and transformers in bf16 and in f32 (how far each bf16 run lies from the f32 ones);
#           `bench` op shares of the DeepSeek-V3.2 4-layer W4A16 and Gemma-4-26B-A4B 6-layer
#           NVFP4A16 slices on CUDA, and of the Gemma-4-31B 6-layer W4A16 slice on the GPU's
#           Vulkan (carry .gl, the loader packages of the device README); carry dist/tw2 and
#           tests/fixtures/tokenizers/gpt2; everything to profile.txt. PARTS picks among
#           precision, benches and vulkan (default all three)
#   vulkanpeer llama.cpp's Vulkan backend against wgpu's one-product mode on the 8B's first 8
#           layers as Q4_0 and BF16 GGUF files (benches/llamacpp_compare.sh run, SKIP_CUDA; the
#           session-66 table of docs/performance.md; GGUF_TYPES, REPEAT override), then `bench`
#           of the BF16 file; carry .gl, tests/fixtures/tokenizers/gpt2 and dist/lcc, made here:
#             benches/llamacpp_compare.sh fetch dist/lc && GLSLC=... VULKAN_HEADERS=...
#             benches/llamacpp_compare.sh build-vulkan dist/lc/llama.cpp.tar.xz dist/lc (the
#             script's header says how on Debian 12) && mkdir dist/lcc && cp -r dist/lc/wheels
#             dist/lc/llama.cpp.tar.xz dist/lcc/ && xz -c dist/lc/llama-perplexity-vulkan >
#             dist/lcc/lpv.xz && xz -c dist/lc/llama-quantize > dist/lcc/lq.xz (14 MB in all)
#           The table to vulkanpeer.txt, the runs in vulkanpeer.tgz
# Results under $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?the device tool sets OUT}"
case "${1:-}" in serve | lmeval | check | slices | sparse | profile | v4 | v4mix | moe | long | glm5next | shadercore | vulkanpeer) ;; *) echo "usage: OUT=dir tools/device_run.sh serve | lmeval | slices | profile | v4 | v4mix | moe | long | glm5next | shadercore | vulkanpeer | check DIR... | sparse DIR..." >&2; exit 2 ;; esac
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
    for dtype in ${DTYPES:-bf16 f32 f32-grade}; do
        for dir in "$@"; do
            $Q check --backend cuda --dtype $dtype --op add --model "$dir" 2>&1 \
                | grep -E "^tests.* (ok|FAIL.*)$|rror" | sed "s/^/$dtype /"
        done
        # OPS (e.g. "--op linear"): those op families' cases too, their failures and summary.
        if [ -n "${OPS:-}" ]; then
            $Q check --backend cuda --dtype $dtype $OPS 2>&1 | grep -E "FAIL|rror|checks? passed|failed" \
                | sed "s/^/$dtype ops: /"
        fi
    done | tee "$OUT/check.txt"
    # VULKAN=1 (carry .gl): the same fixtures and OPS through the GPU's Vulkan driver.
    if [ -n "${VULKAN:-}" ]; then
        for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
        models=$(for dir in "$@"; do echo --model "$dir"; done)
        $Q check --backend wgpu ${OPS:---op add} $models 2>&1 \
            | grep -E "^tests.* (ok|FAIL.*)$|FAIL|rror|checks? passed|failed" | sed "s/^/vulkan /" \
            | tee -a "$OUT/check.txt"
    fi
    ;;
v4)
    for dtype in bf16 f32; do
        $Q check --backend cuda --dtype $dtype --op sparse_attention --op streams --op mixture 2>&1 \
            | grep -E "FAIL|rror|checks? passed|failed" | sed "s/^/$dtype ops: /"
        for dir in tests/fixtures/synth-deepseek-v4-*; do
            [ -d "$dir" ] || continue
            $Q check --backend cuda --dtype $dtype --op add --model "$dir" 2>&1 \
                | grep -E "^tests.* (ok|FAIL.*)$|rror" | sed "s/^/$dtype /"
        done
    done | tee "$OUT/check.txt"
    # Stopped short of the call's 10 minutes so that what was measured comes back.
    timeout 480 env WHEELS=dist/tw RUNS=${RUNS:-2} ROWS=${ROWS:-100} bash benches/deepseek_v4_vs_transformers.sh \
        $Q tests/fixtures/tokenizers/gpt2/tokenizer.json assets/wikitext-2-raw/wiki.test.raw "$WORK/v4" 2>&1 | tail -8
    cp "$WORK/v4/v4.txt" "$OUT/"
    tar czf "$OUT/v4.tgz" -C "$WORK" v4
    ;;
moe)
    # Issue 54's mixture on this GPU: Qwen3-30B-A3B W4A16 (synth) through `bench` (op shares)
    # and eval, at transformers' 8,192-token batch and at quantppl's own, against transformers
    # + compressed-tensors (the machine's transformers, dist/tw2) at 4 and 16 windows a batch;
    # carry dist/tw2 and tests/fixtures/tokenizers/gpt2. The table to moe.txt.
    $Q check --backend cuda --op streams 2>&1 | grep -E "FAIL|rror|checks? passed" | sed "s/^/bf16 streams: /" \
        | tee "$OUT/moe.txt"
    pip install -q --no-deps --no-index --target /tmp/pyx dist/tw2/*.whl 2>/dev/null
    TOK=tests/fixtures/tokenizers/gpt2/tokenizer.json TEXT=assets/wikitext-2-raw/wiki.test.raw
    M=$WORK/qwen3-30b-a3b-w4a16; R=$OUT/moe
    mkdir -p $R
    t0=$(date +%s)
    [ -d $M ] || $Q synth --shape qwen3-30b-a3b --scheme w4a16-g128 --out $M -q
    echo "synth: $(($(date +%s) - t0)) s" | tee -a "$OUT/moe.txt"
    $Q bench --model $M --backend cuda --ctx 2048 --batch 4 --iters 5 2>&1 | tee $R/bench.txt | grep -E "throughput|experts|linear|attention|lm_head|router" | tee -a "$OUT/moe.txt"
    ARGS="--method exl3 --ctx 2048 --stride 512 --rows ${ROWS:-200}"
    for r in 1 2; do
        $Q eval --model $M --tokenizer $TOK --data $TEXT $ARGS --backend cuda --batch-tokens 8192 -q --json $R/q-8192-$r.json
        $Q eval --model $M --tokenizer $TOK --data $TEXT $ARGS --backend cuda -q --json $R/q-own-$r.json
    done
    for b in 4 16; do
        timeout 200 env PYTHONPATH=/tmp/pyx python3 benches/transformers_compare.py $M $TOK $TEXT --ctx 2048 \
            --stride 512 --rows ${ROWS:-200} --batch $b > $R/t-$b.json
    done
    python3 - $R <<'PY' | tee -a "$OUT/moe.txt"
import glob, json, os, statistics, sys
r, gib = sys.argv[1], 1 << 30
for name, label in [("q-8192", "quantppl, 8,192-token batches"), ("q-own", "quantppl, its own batch"),
                    ("t-4", "transformers, 4 windows"), ("t-16", "transformers, 16 windows")]:
    js = [json.load(open(f)) for f in sorted(glob.glob(f"{r}/{name}*.json")) if os.path.getsize(f)]
    if not js:
        continue
    tps = [j["tokens_per_second"] for j in js]
    peak = js[0].get("peak_device_memory_bytes") or js[0].get("peak_gpu_memory_bytes")
    batch = js[0].get("batch_tokens", "")
    print(f"{label:<32} PPL {js[0]['ppl']:.4f}  {statistics.median(tps):>8.0f} tok/s {tps}  peak {peak / gib:.2f} GiB {batch}")
PY
    ;;
glm5next)
    # A GLM-5.3-Flash slice (benches/glm5_next_slice.py: a KDA layer and an indexed-attention
    # layer, both with mixtures; carry dist/tw): `bench` shares at ctx 2048 (dense attention),
    # 8192 (sparse over the expanded heads) and 32768 (in the latent space); with PART=eval
    # instead, benches/slice_vs_transformers.sh on it (RUNS, ROWS): glm5next.txt.
    WHEELS=dist/tw . benches/transformers_wheels.sh
    M=$WORK/glm5-next-slice
    [ -d $M ] || python3 benches/glm5_next_slice.py $M >&2
    if [ "${PART:-bench}" = forms ]; then
        # The KDA's chunked and step kernels at 8 and 4 windows of 2048, each through
        # QUANTPPL_DEV=cuda-recurrence (chunks, the default, or steps).
        for m in "8 steps" "8 chunks" "4 chunks" "4 steps"; do
            set -- $m
            echo "== bench ctx 2048 x $1, cuda-recurrence=$2" | tee -a "$OUT/glm5next.txt"
            QUANTPPL_DEV=cuda-recurrence=$2 $Q bench --model $M --backend cuda --ctx 2048 --batch $1 \
                --iters 3 2>&1 | grep -E "throughput|experts|linear_recurrence|lm_head" \
                | tee -a "$OUT/glm5next.txt"
        done
    elif [ "${PART:-bench}" = bench ]; then
        for m in "2048 4" "8192 1" "32768 1"; do
            set -- $m
            echo "== bench ctx $1 x $2" | tee -a "$OUT/glm5next.txt"
            $Q bench --model $M --backend cuda --ctx $1 --batch $2 --iters 2 2>&1 | tail -22 \
                | tee -a "$OUT/glm5next.txt"
        done
    else
        MODEL=$M SHAPE=glm5.3-flash SCHEME=bf16 RUNS=${RUNS:-2} ROWS=${ROWS:-20} \
            benches/slice_vs_transformers.sh $Q tests/fixtures/tokenizers/gpt2/tokenizer.json \
            assets/wikitext-2-raw/wiki.test.raw "$OUT/runs" 2>&1 | tail -8 | tee -a "$OUT/glm5next.txt"
    fi
    ;;
v4mix)
    # The hyper-connections' kernels alone: `check --op streams` in bf16 and f32, then `bench`
    # of the V4-Flash slice in bf16 (carry dist/tw): v4mix.txt.
    for dtype in bf16 f32; do
        $Q check --backend cuda --dtype $dtype --op streams 2>&1 | grep -E "FAIL|rror|checks? passed" \
            | sed "s/^/$dtype streams: /"
    done | tee "$OUT/v4mix.txt"
    WHEELS=dist/tw . benches/transformers_wheels.sh
    python3 benches/deepseek_v4_slice.py $WORK/v4-flash-bf16 >&2
    $Q bench --model $WORK/v4-flash-bf16 --backend cuda --ctx 2048 --batch 4 --iters 3 2>&1 \
        | grep -E "throughput|mix_streams|hyper_weights|experts|batch" | tee -a "$OUT/v4mix.txt"
    ;;
long)
    # Issue 54's long-window table, wgpu's 128k row: the 8B (Llama 3.1's shapes, W4A16) over
    # one window of 131,072 tokens on the GPU's Vulkan (carry .gl and
    # tests/fixtures/tokenizers/gpt2), its MLP in row blocks where the binding is smaller.
    for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    $Q devices 2>&1 | grep wgpu | tee "$OUT/long.txt"
    M=$WORK/llama3.1-8b-w4a16-g128
    [ -d $M ] || $Q synth --shape llama3.1-8b --scheme w4a16-g128 --seed 0 --out $M -q
    if [ -n "${BENCH:-}" ]; then
        # BENCH=1: where one such window's time goes (`bench`'s profiled batch alone).
        timeout ${LONG_S:-500} $Q bench --model $M --backend wgpu --ctx ${CTX:-131072} --batch 1 \
            --iters 0 2>&1 | tail -25 | tee -a "$OUT/long.txt"
    else
        timeout ${LONG_S:-500} $Q eval --model $M --backend wgpu --tokenizer tests/fixtures/tokenizers/gpt2/tokenizer.json \
            --data assets/wikitext-2-raw/wiki.test.raw --method llamacpp --ctx ${CTX:-131072} --rows 1 \
            --json "$OUT/eval_wgpu_${CTX:-131072}.json" 2>&1 | tail -6 | tee -a "$OUT/long.txt"
    fi
    ;;
shadercore)
    for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    $Q devices 2>&1 | grep wgpu | tee "$OUT/shadercore.txt"
    for m in "llama3-8b w4a16-g128 8" "llama3-8b dense-bf16 8" "qwen3-0.6b w4a16-g128 0"; do
        set -- $m
        M=$WORK/$1-$2-$3
        [ -d $M ] || $Q synth --shape $1 --scheme $2 --seed 0 --out $M $([ $3 = 0 ] || echo --layers $3) -q
    done
    bench() {  # label, QUANTPPL_DEV, model, batch
        echo "== $1 ($3, ${2:-coop on}, batch $4 x 2048)"
        QUANTPPL_DEV=$2 timeout ${BENCH_S:-150} $Q bench --model $WORK/$3 --backend wgpu --ctx 2048 \
            --batch $4 --iters ${ITERS:-3} 2>&1 | grep -vE "^(model|backend|load|memory) " | head -${ROWS_SHOWN:-14}
    }
    for t in ${TILES:-default}; do
        dev=wgpu-coop=off$([ $t = default ] || echo ,wgpu-tiles=$t)
        for m in llama3-8b-w4a16-g128-8 llama3-8b-dense-bf16-8 qwen3-0.6b-w4a16-g128-0; do
            bench "shader cores, tiles $t" $dev $m ${BATCH:-4}
        done
    done 2>&1 | tee -a "$OUT/shadercore.txt"
    [ -n "${NO_COOP_ON:-}" ] || bench "one product" "" llama3-8b-dense-bf16-8 ${BATCH:-4} 2>&1 \
        | tee -a "$OUT/shadercore.txt"
    ;;
vulkanpeer)
    for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    L=/tmp/lc; mkdir -p $L
    xz -dc dist/lcc/lpv.xz > $L/llama-perplexity-vulkan; xz -dc dist/lcc/lq.xz > $L/llama-quantize
    chmod +x $L/*
    t0=$(date +%s)
    SKIP_CUDA=1 ONLY_GGUF=1 SYNTH_LAYERS=8 GGUF_TYPES="${GGUF_TYPES:-Q4_0 BF16}" VULKAN_CHUNKS=20 \
        REPEAT=${REPEAT:-3} LLAMA_BATCHES="default 8192:4096" QUANTPPL_BATCHES="default 2048" \
        QUANTPPL_DTYPES=auto VULKAN_PERPLEXITY=$L/llama-perplexity-vulkan \
        LLAMA_QUANTIZE=$L/llama-quantize WHEELS=dist/lcc/wheels WORK=/tmp/llamacpp-compare \
        bash benches/llamacpp_compare.sh run dist/lcc/llama.cpp.tar.xz $Q \
        tests/fixtures/tokenizers/gpt2 assets/wikitext-2-raw/wiki.test.raw /tmp/vulkanpeer \
        > /tmp/vulkanpeer.log 2>&1
    echo "llamacpp_compare: rc $?, $(($(date +%s) - t0)) s" | tee "$OUT/vulkanpeer.txt"
    grep -E "vulkan|wgpu|PPL" /tmp/vulkanpeer.log | tail -12 | tee -a "$OUT/vulkanpeer.txt"
    $Q bench --model /tmp/llamacpp-compare/l8-bf16.gguf --backend wgpu --ctx 2048 --batch 4 \
        --iters 3 2>&1 | grep -E "throughput|^  " | tee -a "$OUT/vulkanpeer.txt"
    tar czf "$OUT/vulkanpeer.tgz" -C /tmp vulkanpeer
    ;;
slices)
    # transformers 5.23 (the fixtures' version) where its wheels import here, else the
    # machine's own with compressed-tensors.
    W=dist/tw2
    if pip install -q --no-deps --no-index --target /tmp/pyt dist/tw/*.whl &&
        PYTHONPATH=/tmp/pyt python3 -c "import transformers.models.deepseek_v32, transformers.models.gemma4"; then
        W=dist/tw
    fi
    rm -rf /tmp/pyt
    echo "wheels: $W"
    TOK=tests/fixtures/tokenizers/gpt2/tokenizer.json TEXT=assets/wikitext-2-raw/wiki.test.raw
    t0=$(date +%s)
    SHAPES=gemma4-26b-a4b RUNS=3 ROWS=${ROWS:-20} WHEELS=$W bash benches/gemma4_vs_transformers.sh \
        $Q $TOK $TEXT "$OUT/gemma4" 2>&1 | grep -A6 "^== " | tee "$OUT/slices.txt"
    echo "gemma4 mixture: $(($(date +%s) - t0)) s"
    t0=$(date +%s)
    SHAPE=deepseek-v3.2 SCHEME=w4a16-g128 LAYERS=4 RUNS=3 ROWS=${ROWS:-20} WHEELS=$W \
        bash benches/slice_vs_transformers.sh $Q $TOK $TEXT "$OUT/dsv32" 2>&1 | grep -A6 "^== " \
        | tee -a "$OUT/slices.txt"
    echo "deepseek-v3.2: $(($(date +%s) - t0)) s"
    tar czf "$OUT/runs.tgz" -C "$OUT" gemma4 dsv32 && rm -rf "$OUT/gemma4" "$OUT/dsv32"
    ;;
sparse)
    shift
    for dtype in bf16 f32 f32-grade; do
        $Q check --backend cuda --dtype $dtype --op sparse_attention --op index_top_k 2>&1 \
            | grep -E "^sparse_attention|^index_top_k|FAIL|rror|checks" | sed "s/^/$dtype /"
        for dir in "$@"; do
            [ $dtype = f32-grade ] && continue
            $Q check --backend cuda --dtype $dtype --op add --model "$dir" 2>&1 \
                | grep -E "^tests.* (ok|FAIL.*)$|rror" | sed "s/^/$dtype /"
        done
    done | tee "$OUT/sparse.txt"
    SHAPES=deepseek-v3.2 SCHEME=w4a16-g128 CTXS="${CTXS:-4096 16384 65536}" \
        bash benches/sparse_attention_ctx.sh $Q "$OUT/sparse" | tee -a "$OUT/sparse.txt"
    tar czf "$OUT/sparse.tgz" -C "$OUT" sparse && rm -rf "$OUT/sparse"
    ;;
profile)
    W=/tmp/quantppl-bench; mkdir -p $W
    TOK=tests/fixtures/tokenizers/gpt2/tokenizer.json TEXT=assets/wikitext-2-raw/wiki.test.raw
    L=${LAYERS:-6}; S=$W/gemma4-26b-a4b-stacked-bf16-$L
    PARTS=${PARTS:-precision benches vulkan}
    : > "$OUT/profile.txt"
    if [[ $PARTS == *precision* && ! -d $S ]]; then
        $Q synth --shape gemma4-26b-a4b --scheme dense-bf16 --layers $L --out $W/dense -q
        python3 benches/stack_experts.py $W/dense $S && rm -rf $W/dense
    fi
    pip install -q --no-deps --no-index --target /tmp/pyx dist/tw2/*.whl 2>/dev/null
    ARGS="--method exl3 --ctx 2048 --stride 512 --rows ${ROWS:-20}"
    [[ $PARTS == *precision* ]] && {
        echo "== gemma4-26b-a4b $L-layer slice, stacked bf16: PPL by tool and precision"
        for dt in bf16 f32; do
            $Q eval --model $S --tokenizer $TOK --data $TEXT $ARGS --backend cuda --dtype $dt -q \
                --json $OUT/g4-q-$dt.json && python3 -c "import json; r = json.load(open('$OUT/g4-q-$dt.json')); print('quantppl', '$dt', r['ppl'], r['mean_nll'])"
        done
        for dt in bfloat16 float32; do
            PYTHONPATH=/tmp/pyx python3 benches/transformers_compare.py $S $TOK $TEXT --ctx 2048 \
                --stride 512 --rows ${ROWS:-20} --batch 4 --dtype $dt > $OUT/g4-t-$dt.json \
                && python3 -c "import json, math; r = json.load(open('$OUT/g4-t-$dt.json')); print('transformers', '$dt', r['ppl'], math.log(r['ppl']))"
        done
    } 2>&1 | tee -a "$OUT/profile.txt"
    [[ $PARTS == *benches* ]] && for m in deepseek-v3.2:w4a16-g128:4 gemma4-26b-a4b:nvfp4a16:6; do
        IFS=: read -r shape scheme layers <<< "$m"
        m=$W/$shape-$scheme-$layers
        [ -d $m ] || $Q synth --shape $shape --scheme $scheme --layers $layers --out $m -q
        $Q bench --model $m --backend cuda --ctx 512 --batch 1 --iters 1 > /dev/null
        $Q bench --model $m --backend cuda --ctx 2048 --batch 4 --iters 3 2>&1 | tee -a "$OUT/profile.txt"
    done
    if [[ $PARTS == *vulkan* && -d .gl ]]; then
        for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
        V=$W/gemma4-31b-w4a16-g128-6
        [ -d $V ] || $Q synth --shape gemma4-31b --scheme w4a16-g128 --layers 6 --out $V -q
        $Q bench --model $V --backend wgpu --ctx 2048 --batch 4 --iters 3 2>&1 | tee -a "$OUT/profile.txt"
    fi
    ;;
lmeval)
    t0=$(date +%s)
    WHEELS=dist/lmw N=${N:-3000} PAGES=${PAGES:-1000} CACHES="${CACHES:-0 16384}" \
        bash benches/lm_eval/gpu_vs_hf.sh $Q assets/stories260K "$OUT/lm_eval" 2>&1 | tail -30
    echo "lm_eval: $(($(date +%s) - t0)) s"
    ;;
esac
