#!/usr/bin/env bash
# llama.cpp's llama-perplexity against quantppl on one GPU, on the same weights: llama.cpp's
# CUDA backend against quantppl's, and its Vulkan backend against quantppl's wgpu one
# (docs/performance.md "Against llama.cpp").
#
#   benches/llamacpp_compare.sh fetch DIR
#       Where PyPI is reachable: llama.cpp's source as the llama-cpp-python sdist vendors it
#       (version LLAMA_CPP_PYTHON, 0.3.36: ggml 0.25.3), cut down to what llama-perplexity,
#       llama-quantize and convert_hf_to_gguf.py need (CPU, CUDA and Vulkan backends), as
#       DIR/llama.cpp.tar.xz (about 2.5 MB), and the wheels gguf-py needs beside it.
#   benches/llamacpp_compare.sh build-vulkan LLAMA_TAR DIR
#       Where glslc, the Vulkan headers and SPIRV-Headers are installed (Debian: glslc
#       libvulkan-dev spirv-headers), e.g. here rather than on the GPU machine: llama-perplexity
#       with the Vulkan backend, libstdc++ linked in, as DIR/llama-perplexity-vulkan (it needs
#       only the Vulkan loader where it runs), and llama-quantize of a CPU-only build as
#       DIR/llama-quantize (small: the Vulkan build's carries every shader). This llama.cpp wants Vulkan headers of 1.3.261 or
#       later (VK_EXT_layer_settings): where the system's are older (Debian 12: 1.3.239),
#       VULKAN_HEADERS names a root holding newer ones, e.g. Debian 13's libvulkan-dev and
#       spirv-headers unpacked with `dpkg -x` (its usr/include and usr/share/cmake are used,
#       and the loader to link, usr/lib/x86_64-linux-gnu/libvulkan.so, unless VULKAN_LIBRARY
#       names another: Debian 13's needs glibc 2.38, so on Debian 12 the system's
#       /usr/lib/x86_64-linux-gnu/libvulkan.so.1).
#       GLSLC names a glslc that knows the cooperative-matrix extensions (shaderc 2025): without
#       them llama.cpp builds its Vulkan backend without tensor cores (cmake says "not
#       supported by glslc"; printed). On Debian 12: `dpkg -x` Debian 13's glslc, libshaderc1,
#       libc6, libstdc++6 and libgcc-s1 into R, and let GLSLC be a script that runs
#       `R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path
#       R/usr/lib/x86_64-linux-gnu:R/lib/x86_64-linux-gnu R/usr/bin/glslc "$@"`.
#   benches/llamacpp_compare.sh run LLAMA_TAR QUANTPPL GPT2_TOKENIZER_DIR TEXT OUT
#       On the GPU machine: builds both llama.cpp tools for the GPU, writes a synthetic
#       Llama-3-8B (`synth`, seed 0; SYNTH_LAYERS its first layers only) in BF16 and
#       W4A16-g128, converts the BF16 one to GGUF
#       (gpt2's tokenizer, padded by the converter to the shape's vocabulary) and quantizes
#       it to Q4_0, then runs `llama-perplexity -c CTX --chunks CHUNKS` (flash attention on)
#       and `quantppl eval --method llamacpp --ctx CTX --rows CHUNKS` on the same text; with
#       GGUF_TYPES (llama-quantize types, e.g. "Q4_K_M Q6_K Q8_0") also those files quantized
#       from the BF16 GGUF, each read by both tools (ONLY_GGUF=1: only those; REPEAT runs of
#       each, llama.cpp at each of LLAMA_BATCHES ("8192:4096" for -b/-ub; "none": quantppl alone,
#       beside a llama.cpp run of the same session), quantppl at each of
#       QUANTPPL_BATCHES (tokens a batch) and of QUANTPPL_DTYPES (`--dtype` values, "auto"
#       by default; e.g. "auto f16" for wgpu's one-product mode too), EXACT=1 one f32 run
#       more; medians). Prints
#       PPL, its +/-, tokens/s and the build time. CTX (2048), CHUNKS (100), WORK
#       (/tmp/llamacpp-compare) and WHEELS (the wheels folder of `fetch`, where gguf-py's
#       needs are missing) from the environment. With VULKAN_PERPLEXITY (a `build-vulkan`
#       binary) also llama.cpp's Vulkan backend and quantppl's wgpu backend on VULKAN_CHUNKS
#       (20) chunks of both checkpoints and of the GGUF_TYPES files (the machine needs the
#       Vulkan loader: see
#       .library/device/README.md); SKIP_CUDA=1 runs only those and builds nothing, taking
#       llama-quantize from LLAMA_QUANTIZE (`build-vulkan`'s).
#   benches/llamacpp_compare.sh table OUT
#       The table of a finished run's OUT again (chunks and context read from the logs).
set -euo pipefail
self=$(realpath "$0")  # `run` changes directory before it calls `table`
step=${1:-}; shift || true
case $step in
fetch)
    out=$(realpath "$1"); tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==${LLAMA_CPP_PYTHON:-0.3.36}" -d "$tmp"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$out/wheels" tqdm==4.70.1 pyyaml==6.0.4 requests==2.34.2 urllib3==2.8.0 \
        idna==3.20 certifi==2026.10.19.post1 charset-normalizer==3.5.3
    tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    src=$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)
    keep=(CMakeLists.txt LICENSE cmake include src common vendor ggml convert_hf_to_gguf.py
          conversion gguf-py tools/perplexity tools/quantize)
    mkdir -p "$tmp/llama.cpp/tools"
    for k in "${keep[@]}"; do cp -r "$src/$k" "$tmp/llama.cpp/$k"; done
    # Only the CPU, CUDA and Vulkan backends, only the two tools; the rest of the tree is docs,
    # models' vocabularies, tests and other backends (176 MB in all).
    find "$tmp/llama.cpp/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' \
        ! -name ggml-cpu ! -name ggml-cuda ! -name ggml-vulkan -exec rm -rf {} +
    rm -rf "$tmp/llama.cpp/vendor/miniaudio"
    printf 'add_subdirectory(perplexity)\nadd_subdirectory(quantize)\n' \
        > "$tmp/llama.cpp/tools/CMakeLists.txt"
    sed -i '/add_subdirectory(miniaudio)/d' "$tmp/llama.cpp/vendor/CMakeLists.txt"
    tar cJf "$out/llama.cpp.tar.xz" -C "$tmp" llama.cpp
    ls -la "$out/llama.cpp.tar.xz"
    ;;
build-vulkan)
    tar=$(realpath "$1"); mkdir -p "$2"; out=$(realpath "$2")
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    tar xJf "$tar" -C "$tmp"
    headers=()
    # llama.cpp compiles its cooperative-matrix shaders (tensor cores) only where glslc knows
    # the extensions (shaderc 2025; Debian 12's 2023.2 does not): GLSLC names a newer one.
    [ -z "${GLSLC:-}" ] || headers=(-DVulkan_GLSLC_EXECUTABLE="$(realpath "$GLSLC")")
    if [ -n "${VULKAN_HEADERS:-}" ]; then
        root=$(realpath "$VULKAN_HEADERS")
        headers=(-DVulkan_INCLUDE_DIR="$root/usr/include"
                 -DVulkan_LIBRARY="${VULKAN_LIBRARY:-$root/usr/lib/x86_64-linux-gnu/libvulkan.so}"
                 -DCMAKE_PREFIX_PATH="$root/usr/share/cmake"
                 -DCMAKE_CXX_FLAGS="-isystem $root/usr/include" "${headers[@]}")
    fi
    # build-vulkan: the Vulkan backend; build-cpu: no GPU backend (for llama-quantize).
    for b in vulkan cpu; do
        flags=(-DGGML_VULKAN=OFF)
        [ $b = cpu ] || flags=("${headers[@]}" -DGGML_VULKAN=ON)
        cmake -S "$tmp/llama.cpp" -B "$tmp/build-$b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            "${flags[@]}" -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
            -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" > "$out/cmake-$b.log"
    done
    grep -i "not supported by glslc" "$out/cmake-vulkan.log" || true
    cmake --build "$tmp/build-vulkan" --target llama-perplexity > "$out/build-vulkan.log"
    cmake --build "$tmp/build-cpu" --target llama-quantize > "$out/build-cpu.log"
    strip -o "$out/llama-perplexity-vulkan" "$tmp/build-vulkan/bin/llama-perplexity"
    strip -o "$out/llama-quantize" "$tmp/build-cpu/bin/llama-quantize"
    ls -la "$out/llama-perplexity-vulkan" "$out/llama-quantize"
    ;;
run)
    tar=$(realpath "$1"); Q=$(realpath "$2"); GPT2=$(realpath "$3"); TEXT=$(realpath "$4")
    OUT=$5; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
    # Paths given from the environment, resolved before the working directory changes.
    vulkan=${VULKAN_PERPLEXITY:+$(realpath "$VULKAN_PERPLEXITY")}
    quantize=${LLAMA_QUANTIZE:+$(realpath "$LLAMA_QUANTIZE")}
    wheels=${WHEELS:+$(realpath "$WHEELS")}
    WORK=${WORK:-/tmp/llamacpp-compare}; CTX=${CTX:-2048}; CHUNKS=${CHUNKS:-100}
    mkdir -p "$WORK"; WORK=$(realpath "$WORK"); cd "$WORK"
    if [ -n "$wheels" ]; then
        python3 -m pip install -q --no-index --no-deps --target "$WORK/site" "$wheels"/*.whl
    fi
    export PYTHONPATH="$WORK/llama.cpp/gguf-py:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
    [ -d llama.cpp ] || tar xJf "$tar"
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0 | tr -d .)
    quantize=${quantize:-$WORK/llama.cpp/build/bin/llama-quantize}
    if [ -z "${SKIP_CUDA:-}" ] && [ ! -x llama.cpp/build/bin/llama-perplexity ]; then
        t0=$(date +%s)
        cmake -S llama.cpp -B llama.cpp/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_OPENSSL=OFF > "$OUT/cmake.log"
        cmake --build llama.cpp/build --target llama-perplexity llama-quantize > "$OUT/build.log"
        echo "llama.cpp built for sm_$arch in $(($(date +%s) - t0)) s"
    fi
    for s in dense-bf16 $([ -n "${ONLY_GGUF:-}" ] || echo w4a16-g128); do
        [ -d "l8-$s" ] || [ -f l8-bf16.gguf ] ||
            "$Q" synth --shape llama3-8b --scheme "$s" --seed 0 --out "l8-$s" -q \
                ${SYNTH_LAYERS:+--layers $SYNTH_LAYERS}
    done
    # The converter reads the tokenizer beside the weights (not gpt2's config.json): it wants
    # the tokenizer.json's model type spelled out, and vocab.json and merges.txt, written here
    # from the tokenizer.json (tests/fixtures/tokenizers/gpt2 keeps only that).
    cp "$GPT2/tokenizer_config.json" l8-dense-bf16/
    python3 - "$GPT2/tokenizer.json" l8-dense-bf16 <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["type"] = "BPE"
json.dump(t, open(sys.argv[2] + "/tokenizer.json", "w"))
json.dump(t["model"]["vocab"], open(sys.argv[2] + "/vocab.json", "w"), ensure_ascii=False)
merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
open(sys.argv[2] + "/merges.txt", "w").write("#version: 0.2\n" + "\n".join(merges) + "\n")
PY
    [ -f l8-bf16.gguf ] || python3 llama.cpp/convert_hf_to_gguf.py l8-dense-bf16 --outtype bf16 \
        --outfile l8-bf16.gguf > "$OUT/convert.log" 2>&1
    if [ -n "${ONLY_GGUF:-}" ]; then
        # Only the GGUF files are read from here on: the 16 GB of safetensors go (disk).
        rm -f l8-dense-bf16/*.safetensors
    elif [ ! -f l8-q4_0.gguf ]; then
        "$quantize" l8-bf16.gguf l8-q4_0.gguf Q4_0 > "$OUT/quantize.log" 2>&1
    fi
    # GGUF_TYPES: llama-quantize types whose files both tools read (quantppl reads GGUF too).
    for t in ${GGUF_TYPES:-}; do
        lower=$(echo "$t" | tr 'A-Z' 'a-z')
        [ -f "l8-$lower.gguf" ] || "$quantize" l8-bf16.gguf "l8-$lower.gguf" "$t" \
            >> "$OUT/quantize.log" 2>&1
    done
    # Same GGUF file, both tools: llama-perplexity, then quantppl with the file's own tokenizer;
    # REPEAT times each, llama.cpp at each of LLAMA_BATCHES (`B` or `B:UB` for -b/-ub; "default"
    # its own), quantppl at each of QUANTPPL_BATCHES (`--batch-tokens N`; "default" its own
    # sizer), and with EXACT=1 once more in f32 (`--dtype f32`: the file's exact perplexity).
    same_file() {
        local bin=$1 fa=$2 backend=$3 chunks=$4 tag=$5
        for t in ${GGUF_TYPES:-}; do
            local g b r d sfx flags; g=$(echo "$t" | tr 'A-Z' 'a-z')
            for r in $(seq "${REPEAT:-1}"); do
                for b in ${LLAMA_BATCHES:-default}; do
                    [ "$b" != none ] || continue
                    flags=()
                    [ "$b" = default ] || flags=(-b "${b%%:*}" -ub "${b##*:}")
                    "$bin" -m "l8-$g.gguf" -f "$TEXT" -c "$CTX" --chunks "$chunks" -ngl 99 \
                        -fa "$fa" "${flags[@]}" > "$OUT/llamacpp${tag}_${g}_b${b/:/-}_r$r.log" 2>&1
                done
                for b in ${QUANTPPL_BATCHES:-default}; do
                    for d in ${QUANTPPL_DTYPES:-auto}; do
                        flags=(--dtype "$d"); sfx=-$d; [ "$d" != auto ] || sfx=
                        [ "$b" = default ] || flags+=(--batch-tokens "$b")
                        "$Q" eval --model "l8-$g.gguf" --data "$TEXT" --method llamacpp \
                            --ctx "$CTX" --rows "$chunks" --backend "$backend" "${flags[@]}" -q \
                            --json "$OUT/quantppl${tag}_gguf_${g}_b$b${sfx}_r$r.json" \
                            > /dev/null
                    done
                done
            done
            if [ -n "${EXACT:-}" ]; then
                "$Q" eval --model "l8-$g.gguf" --data "$TEXT" --method llamacpp --ctx "$CTX" \
                    --rows "$chunks" --backend "$backend" --dtype f32 -q \
                    --json "$OUT/quantppl${tag}_gguf_${g}_bf32_r1.json" > /dev/null
            fi
        done
    }
    # One backend pair: llama-perplexity binary, its flash-attention setting, quantppl's
    # backend, chunks, and the name in the logs.
    compare() {
        local bin=$1 fa=$2 backend=$3 chunks=$4 tag=$5
        for g in bf16 q4_0; do
            "$bin" -m "l8-$g.gguf" -f "$TEXT" -c "$CTX" --chunks "$chunks" -ngl 99 -fa "$fa" \
                > "$OUT/llamacpp${tag}_$g.log" 2>&1
        done
        for s in dense-bf16 w4a16-g128; do
            "$Q" eval --model "l8-$s" --tokenizer l8-dense-bf16/tokenizer.json \
                --data "$TEXT" --method llamacpp --ctx "$CTX" --rows "$chunks" \
                --backend "$backend" -q --json "$OUT/quantppl${tag}_$s.json" > /dev/null
        done
    }
    if [ -z "${SKIP_CUDA:-}" ]; then
        [ -n "${ONLY_GGUF:-}" ] || compare llama.cpp/build/bin/llama-perplexity on cuda "$CHUNKS" ""
        same_file llama.cpp/build/bin/llama-perplexity on cuda "$CHUNKS" ""
    fi
    if [ -n "$vulkan" ]; then
        # Flash attention where llama.cpp's Vulkan backend has it for this device.
        [ -n "${ONLY_GGUF:-}" ] || compare "$vulkan" auto wgpu "${VULKAN_CHUNKS:-20}" _vulkan
        same_file "$vulkan" auto wgpu "${VULKAN_CHUNKS:-20}" _vulkan
    fi
    bash "$self" table "$OUT"
    ;;
table)
    # llama-perplexity's time: from "calculating perplexity" to "Final estimate" (its log's
    # timestamps are minutes.seconds.milliseconds.microseconds), over the chunks and context
    # that line names; quantppl's after loading. "after chunk 1": llama.cpp's time after its
    # first pass of `n_seq` chunks ("seconds per pass" is logged then), which on Vulkan includes
    # compiling its pipelines (10-20 s with cooperative matrices). The rows of each backend pair
    # that ran.
    python3 - "$1" <<'PY'
import json, os, re, sys
o = sys.argv[1]
def at(line):
    m, s, ms, us = map(int, line.split()[0].split("."))
    return 60 * m + s + ms / 1e3 + us / 1e6
print(f"{'':<40}{'PPL':>14}{'+/-':>12}{'tokens/s':>10}{'after chunk 1':>15}")
def llamacpp_run(path):
    lines = open(path).read().splitlines()
    calc = next(l for l in lines if "calculating perplexity" in l)
    chunks, ctx, seqs = map(int, re.search(
        r"over (\d+) chunks, n_ctx=(\d+), batch_size=\d+, n_seq=(\d+)", calc).groups())
    final = next(l for l in lines if "Final estimate" in l)
    first = next(l for l in lines if "seconds per pass" in l)
    ppl, pm = re.search(r"PPL = ([\d.]+) \+/- ([\d.]+)", final).groups()
    # The first pass holds `n_seq` chunks.
    return (float(ppl), float(pm), chunks * ctx / (at(final) - at(calc)),
            (chunks - seqs) * ctx / (at(final) - at(first)))
def llamacpp(tag, g, backend):
    ppl, pm, tps, after = llamacpp_run(f"{o}/llamacpp{tag}_{g}.log")
    print(f"{f'llama.cpp {backend} {g}':<40}{ppl:>14.4f}{pm:>12.5f}{tps:>10.0f}{after:>15.0f}")
def quantppl(path, label):
    r = json.load(open(path))
    print(f"{label:<40}{r['ppl']:>14.4f}{r['ppl_stderr']:>12.5f}{r['tokens_per_second']:>10.0f}")
def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
for tag, ours in [("", "cuda"), ("_vulkan", "wgpu")]:
    backend = "vulkan" if tag else "cuda"
    # The same GGUF file through both tools (GGUF_TYPES): each tool at each batch, the median
    # of its runs' tokens/s (the runs' own in brackets), the first run's PPL and +/-.
    runs = {}
    for f in sorted(os.listdir(o)):
        m = re.fullmatch(
            rf"(llamacpp|quantppl){tag}(?!_vulkan)(?:_gguf)?_([a-z0-9_]+)_b([\w-]+)_r(\d+)\.(?:log|json)",
            f)
        if m:
            runs.setdefault((m[2], m[1], m[3]), []).append(f"{o}/{f}")
    for (g, tool, batch), paths in sorted(runs.items()):
        if tool == "llamacpp":
            got = [llamacpp_run(p) for p in paths]
            ppl, pm = got[0][:2]
            tps = [x[2] for x in got]
            after = f"{median([x[3] for x in got]):>15.0f}"
            label = f"llama.cpp {backend} {g} -b {batch}"
        else:
            got = [json.load(open(p)) for p in paths]
            ppl, pm = got[0]["ppl"], got[0]["ppl_stderr"]
            tps = [x["tokens_per_second"] for x in got]
            after = f"{'':>15}"
            batch, _, dtype = batch.partition("-")
            label = f"quantppl {ours} {g} " + ("f32" if batch == "f32" else f"batch {batch}")
            label += f" --dtype {dtype}" if dtype else ""
        each = "/".join(f"{t:.0f}" for t in tps)
        print(f"{label:<40}{ppl:>14.4f}{pm:>12.5f}{median(tps):>10.0f}{after}  ({each})")
    if not os.path.exists(f"{o}/llamacpp{tag}_bf16.log"):
        continue
    for g in ["bf16", "q4_0"]:
        llamacpp(tag, g, backend)
    for s in ["dense-bf16", "w4a16-g128"]:
        quantppl(f"{o}/quantppl{tag}_{s}.json", f"quantppl {ours} {s}")
PY
    ;;
*)
    sed -n '2,20p' "$self"; exit 2 ;;
esac
