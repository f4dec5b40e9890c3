#!/usr/bin/env bash
# lm-evaluation-harness drives `quantppl serve`: its `local-completions` model runs lm-eval's
# wikitext task (the same documents, detokenizer and word counts, read from a local file made
# from the bundled wiki.test.raw) and a small multiple-choice task against the server
# on the bundled model; lm-eval's word_perplexity is then compared with
# `quantppl eval --method lm-eval` on the same model.
#
#   LM_EVAL=/path/to/venv/bin/lm_eval benches/lm_eval/run.sh [--backend cpu|cuda|wgpu]
#
# Needs lm_eval[api] 0.4.13 in that venv (its python runs wikitext_pages.py) and a built
# target/release/quantppl. Prints a short table last.
set -euo pipefail
cd "$(dirname "$0")/../.."
LM_EVAL=${LM_EVAL:-lm_eval}
PY="$(dirname "$(command -v "$LM_EVAL")")/python3"
Q=target/release/quantppl
BACKEND=(${@:---backend cpu})
HERE=benches/lm_eval
WORK=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$WORK"' EXIT

"$PY" $HERE/wikitext_pages.py assets/wikitext-2-raw/wiki.test.raw > "$WORK/pages.jsonl"
mkdir -p "$WORK/tasks"
cp $HERE/stories_choice.jsonl "$WORK/"
source $HERE/tasks.sh
wikitext_task "$WORK/tasks" "$WORK/pages.jsonl"
choice_task "$WORK/tasks" stories_choice "$WORK/stories_choice.jsonl"

"$Q" serve "${BACKEND[@]}" --port 0 2> "$WORK/serve.log" &
SERVER=$!
for _ in $(seq 100); do grep -q "listening on" "$WORK/serve.log" && break; sleep 0.2; done
URL=$(grep -o "http://[0-9.:]*" "$WORK/serve.log" | head -1)
echo "server: $URL"

TOKENIZER=assets/stories260K-w4a16-channel
start=$(date +%s.%N)
"$LM_EVAL" run --model local-completions \
    --model_args "model=stories260K,base_url=$URL/v1/completions,tokenizer_backend=huggingface,tokenizer=$TOKENIZER,tokenized_requests=True,max_length=513,num_concurrent=4" \
    --tasks wikitext_local,stories_choice --include_path "$WORK/tasks" \
    --output_path "$WORK/out" > "$WORK/lm_eval.log" 2>&1 || { tail -30 "$WORK/lm_eval.log"; exit 1; }
lm_seconds=$(echo "$(date +%s.%N) - $start" | bc)
RESULTS=$(find "$WORK/out" -name 'results_*.json' | head -1)

# local-completions with max_length=M keeps M-1 tokens per prompt (one is held back for a
# generated token) and rolls windows of M-2 predicted tokens after one context token: the
# windows of `quantppl eval --method lm-eval --ctx M-2`. M = 513 fills the model's 512.
"$Q" eval "${BACKEND[@]}" -q --method lm-eval --ctx 511 --json "$WORK/eval.json" > /dev/null

"$PY" - "$RESULTS" "$WORK/eval.json" "$lm_seconds" <<'PY'
import json, sys
lm = json.load(open(sys.argv[1]))["results"]
q = json.load(open(sys.argv[2]))["lm_eval"]
w = lm["wikitext_local"]
print(f"{'':34}{'lm-eval via serve':>20}{'quantppl eval':>16}{'rel diff':>10}")
for key in ["word_perplexity", "byte_perplexity", "bits_per_byte"]:
    a, b = w[key + ",none"], q[key]
    print(f"wikitext {key:25}{a:20.6f}{b:16.6f}{abs(a - b) / b:10.1e}")
c = lm["stories_choice"]
print(f"stories_choice acc {c['acc,none']:.4f}, acc_norm {c['acc_norm,none']:.4f} (12 items)")
print(f"lm-eval wall time {float(sys.argv[3]):.1f} s")
PY
