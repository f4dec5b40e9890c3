#!/usr/bin/env bash
# lm-evaluation-harness on one GPU and checkpoint, two ways: its own `hf` backend
# (transformers + compressed-tensors, bf16) and `local-completions` through `quantppl serve`
# (its default precision; without the prefix cache, then with it; each server answers one
# request before lm-eval is timed). Tasks: a multiple-choice task
# of N items made from wiki.test.raw (wiki_choice.py: choices of different lengths, which
# lm-eval's length-sorted order spreads over its requests) and lm-eval's wikitext rolling task
# (wikitext_pages.py), both with windows of 2047 predicted tokens, both tokenized by the
# model folder's tokenizer (synth writes stories260K's, 512 tokens), each with lm-eval's own
# defaults for it.
# Prints each run's wall time, the accuracies and perplexities, and how far each choice's
# log-likelihood lies from hf's.
#
#   [WHEELS=dir N=2000 PAGES=all SHAPE=llama3-8b SCHEME=w4a16-g128 | MODEL=dir] [MAXLEN=2048] \
#       [BACKEND=cuda DEVICE=cuda CACHE_MB=16384 CACHES="0 16384"] \
#       benches/lm_eval/gpu_vs_hf.sh QUANTPPL TOKENIZER_DIR OUT
#
# WHEELS: cp312 wheels of lm_eval 0.4.13 and what it needs beyond the machine's Python (it has
# torch and transformers), plus compressed-tensors 0.20; installed to /tmp/pyx.
set -euo pipefail
Q=$(realpath "$1"); TOK=$(realpath "$2"); OUT=$(realpath -m "$3")
N=${N:-2000}; SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; MAXLEN=${MAXLEN:-2048}
BACKEND=${BACKEND:-cuda}; DEVICE=${DEVICE:-cuda}; CACHE_MB=${CACHE_MB:-16384}
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
cat > "$T/wikitext_local.yaml" <<YAML
task: wikitext_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: $T/pages.jsonl
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: !function wikitext_fns.wikitext_detokenizer
process_results: !function wikitext_fns.process_results
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
YAML
echo "from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer, process_results" \
    > "$T/wikitext_fns.py"
cat > "$T/wiki_choice.yaml" <<YAML
task: wiki_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: $T/choice.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
  - metric: acc_norm
YAML
lm_eval() { # NAME MODEL MODEL_ARGS BATCH [ARGS...]
    local start name=$1 model=$2 model_args=$3 batch=$4; shift 4
    start=$(date +%s.%N)
    python3 -m lm_eval run --model "$model" --model_args "$model_args" --batch_size "$batch" "$@" \
        --tasks wikitext_local,wiki_choice --include_path "$T" --log_samples \
        --output_path "$OUT/$name" > "$OUT/$name.log" 2>&1 || { tail -30 "$OUT/$name.log"; exit 1; }
    echo "$name $(python3 -c "print($(date +%s.%N) - $start)")" >> "$OUT/wall.txt"
}
: > "$OUT/wall.txt"
# Rolling windows: hf predicts max_length tokens a window, an API model max_length - 1.
lm_eval hf hf "pretrained=$M,dtype=bfloat16,max_length=$((MAXLEN - 1))" 64 --device "$DEVICE"
for cache in ${CACHES:-0 $CACHE_MB}; do
    "$Q" serve --model "$M" --tokenizer "$TOK" --backend "$BACKEND" --port 0 --max-batch-tokens 16384 \
        --prefix-cache-mb $cache 2> "$OUT/serve-$cache.log" &
    SERVER=$!
    for _ in $(seq 600); do grep -q "listening on" "$OUT/serve-$cache.log" && break; sleep 0.5; done
    URL=$(grep -o "http://[0-9.:]*" "$OUT/serve-$cache.log" | head -1)
    # One request first: a first start compiles the CUDA kernels (cached for later starts).
    curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": [[1, 2, 3, 4, 5, 6, 7, 8, 9]], "echo": true, "logprobs": 1, "max_tokens": 1}' > /dev/null
    lm_eval "serve-cache-$cache" local-completions \
        "model=$M,base_url=$URL/v1/completions,tokenizer_backend=huggingface,tokenizer=$TOK,tokenized_requests=True,max_length=$MAXLEN,num_concurrent=8" 32
    kill $SERVER; wait $SERVER 2>/dev/null || true; SERVER=
done
grep -h "prefix cache gave" "$OUT"/serve-*.log || true
python3 - "$OUT" "$CACHE_MB" <<'PY'
import glob, json, sys
out = sys.argv[1]
wall = dict(l.split() for l in open(f"{out}/wall.txt"))
def results(name):
    return json.load(open(glob.glob(f"{out}/{name}/**/results_*.json", recursive=True)[0]))["results"]
def samples(name, task):
    f = glob.glob(f"{out}/{name}/**/samples_{task}_*.jsonl", recursive=True)[0]
    return {json.loads(l)["doc_id"]: json.loads(l) for l in open(f)}
cache_mb = sys.argv[2]
runs = [r for r in ["hf", f"serve-cache-{cache_mb}", "serve-cache-0"] if r in wall]
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
