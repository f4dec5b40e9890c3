#!/usr/bin/env bash
# lm-evaluation-harness on one GPU and checkpoint, two ways: its own `hf` backend
# (transformers + compressed-tensors, bf16) and `local-completions` through `quantppl serve`
# (its default precision; without the prefix cache, then with it; each server answers one
# request before lm-eval is timed). Tasks: a multiple-choice task
# of N items made from wiki.test.raw (wiki_choice.py: choices of different lengths, which
# lm-eval's length-sorted order spreads over its requests) and lm-eval's wikitext rolling task
# (wikitext_pages.py), both with the same rolling windows (M - 2 tokens), both tokenized by the
# model folder's tokenizer (synth writes stories260K's, 512 tokens), local-completions with
# `add_bos_token=True` as the hf backend adds it.
# Prints each run's wall time, the accuracies and perplexities, and how far each choice's
# log-likelihood lies from hf's; each run's progress bars at their end (how long each request
# phase took) and each server's scoring time.
#
#   [WHEELS=dir N=2000 PAGES=all SHAPE=llama3-8b SCHEME=w4a16-g128 | MODEL=dir] [MAXLEN=2048] \
#       [BACKEND=cuda DEVICE=cuda HF_DTYPE=bfloat16 CACHE_MB=16384 CACHES="0 16384"] \
#       [HF_BATCH=64 SERVE_BATCH=32 CONCURRENT=8 MAX_BATCH=16384] \
#       benches/lm_eval/gpu_vs_hf.sh QUANTPPL TOKENIZER_DIR OUT
#
# WHEELS: cp312 wheels of lm_eval 0.4.13 and what it needs beyond the machine's Python (it has
# torch and transformers): its own requirements, `accelerate` (the hf backend), `tenacity`
# (local-completions), and compressed-tensors 0.20 with pydantic and loguru; installed to
# /tmp/pyx (tools/device_run.sh says how to gather them).
set -euo pipefail
Q=$(realpath "$1"); TOK=$(realpath "$2"); OUT=$(realpath -m "$3")
N=${N:-2000}; SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; MAXLEN=${MAXLEN:-2048}
BACKEND=${BACKEND:-cuda}; DEVICE=${DEVICE:-cuda}; CACHE_MB=${CACHE_MB:-16384}
# lm-eval's hf backend adds BOS where the tokenizer has one (README, "BOS"): so does
# local-completions here, unless BOS=False.
BOS=${BOS:-True}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
if [ -n "${WHEELS:-}" ]; then
    pip install -q --no-deps --no-index --target /tmp/pyx "$WHEELS"/*.whl 2>&1 | tail -2
    export PYTHONPATH=/tmp/pyx
fi
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
M=${MODEL:-${WORK:-/tmp}/quantppl-bench/$SHAPE-$SCHEME}
mkdir -p "$OUT" "$(dirname "$M")"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --seed 0 --out "$M" -q
# hf reads the tokenizer in the model's folder (synth writes one): lm-eval's local-completions
# tokenizes with that one too, TOKENIZER_DIR only filling a folder without one.
[ -f "$M/tokenizer.json" ] || for f in tokenizer.json tokenizer_config.json special_tokens_map.json vocab.json merges.txt; do
    [ ! -f "$TOK/$f" ] || cp "$TOK/$f" "$M/"
done
TOK=$M
WORK_DIR=$(mktemp -d)
SERVER=
trap '[ -z "$SERVER" ] || kill $SERVER 2>/dev/null; rm -rf "$WORK_DIR"' EXIT
T=$WORK_DIR/tasks
mkdir -p "$T"
python3 "$HERE/wikitext_pages.py" "$ROOT/assets/wikitext-2-raw/wiki.test.raw" > "$T/all.jsonl"
head -n "${PAGES:-1000000}" "$T/all.jsonl" > "$T/pages.jsonl"
python3 "$HERE/wiki_choice.py" "$ROOT/assets/wikitext-2-raw/wiki.test.raw" "$N" > "$T/choice.jsonl"
source "$HERE/tasks.sh"
wikitext_task "$T" "$T/pages.jsonl"
choice_task "$T" wiki_choice "$T/choice.jsonl"
lm_eval() { # NAME MODEL MODEL_ARGS BATCH [ARGS...]
    local start name=$1 model=$2 model_args=$3 batch=$4; shift 4
    start=$(date +%s.%N)
    python3 -m lm_eval run --model "$model" --model_args "$model_args" --batch_size "$batch" "$@" \
        --tasks wikitext_local,wiki_choice --include_path "$T" --log_samples \
        --output_path "$OUT/$name" > "$OUT/$name.log" 2>&1 || { tail -30 "$OUT/$name.log"; exit 1; }
    echo "$name $(python3 -c "print($(date +%s.%N) - $start)")" >> "$OUT/wall.txt"
    echo "$name: $(tr '\r' '\n' < "$OUT/$name.log" | grep -o "100%|[^|]*| [0-9]*/[0-9]* \[[0-9:]*" \
        | sed 's/.*| //' | tr '\n' ' ')" >> "$OUT/phases.txt"
}
: > "$OUT/wall.txt"; : > "$OUT/phases.txt"
# Rolling windows: an API model of max_length M holds M - 1 tokens and keeps one of them for
# context, so its windows are hf's at max_length M - 2.
lm_eval hf hf "pretrained=$M,dtype=${HF_DTYPE:-bfloat16},max_length=$((MAXLEN - 2))" "${HF_BATCH:-64}" --device "$DEVICE"
for cache in ${CACHES:-0 $CACHE_MB}; do
    "$Q" serve --model "$M" --tokenizer "$TOK" --backend "$BACKEND" --port 0 --max-batch-tokens "${MAX_BATCH:-16384}" \
        --prefix-cache-mb $cache 2> "$OUT/serve-$cache.log" &
    SERVER=$!
    for _ in $(seq 600); do grep -q "listening on" "$OUT/serve-$cache.log" && break; sleep 0.5; done
    URL=$(grep -o "http://[0-9.:]*" "$OUT/serve-$cache.log" | head -1)
    # One request first: a first start compiles the CUDA kernels (cached for later starts).
    curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": [[1, 2, 3, 4, 5, 6, 7, 8, 9]], "echo": true, "logprobs": 1, "max_tokens": 1}' > /dev/null
    lm_eval "serve-cache-$cache" local-completions \
        "model=$M,base_url=$URL/v1/completions,tokenizer_backend=huggingface,tokenizer=$TOK,tokenized_requests=True,max_length=$MAXLEN,num_concurrent=${CONCURRENT:-8},add_bos_token=$BOS" "${SERVE_BATCH:-32}"
    kill $SERVER; wait $SERVER 2>/dev/null || true; SERVER=
done
cat "$OUT/phases.txt"
grep -h "s scoring" "$OUT"/serve-*.log || true
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
wall = dict(l.split() for l in open(f"{out}/wall.txt"))
def results(name):
    return json.load(open(glob.glob(f"{out}/{name}/**/results_*.json", recursive=True)[0]))["results"]
def samples(name, task):
    f = glob.glob(f"{out}/{name}/**/samples_{task}_*.jsonl", recursive=True)[0]
    return {json.loads(l)["doc_id"]: json.loads(l) for l in open(f)}
runs = list(wall)  # hf, then each server in the order they ran
res = {r: results(r) for r in runs}
print("| run | wall s | wiki_choice acc | acc_norm | wikitext word_perplexity | byte_perplexity |")
print("|---|---|---|---|---|---|")
for r in runs:
    c, w = res[r]["wiki_choice"], res[r]["wikitext_local"]
    print(f"| {r} | {float(wall[r]):.1f} | {c['acc,none']:.4f} | {c['acc_norm,none']:.4f} | "
          f"{w['word_perplexity,none']:.6f} | {w['byte_perplexity,none']:.6f} |")
hf = samples("hf", "wiki_choice")
for r in runs[1:]:
    s = samples(r, "wiki_choice")
    diffs = [abs(float(a[0]) - float(b[0])) for d in hf for a, b in
             zip(hf[d]["filtered_resps"], s[d]["filtered_resps"])]
    picks = sum(hf[d]["acc"] != s[d]["acc"] for d in hf) if "acc" in hf[0] else -1
    diffs.sort()
    print(f"{r} against hf: {len(diffs)} choices, |loglikelihood difference| median "
          f"{diffs[len(diffs) // 2]:.2e}, p99 {diffs[int(0.99 * (len(diffs) - 1))]:.2e}, "
          f"max {diffs[-1]:.2e}; items scored otherwise {picks}")
for r in runs[1:]:
    print(f"hf / {r} wall time: {float(wall['hf']) / float(wall[r]):.2f}x")
PY
