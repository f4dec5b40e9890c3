#!/usr/bin/env bash
# docs/performance.md "`serve`": scored tokens/s of `quantppl serve` under benches/serve_load.py
# (lm-eval's loglikelihood shape: random token ids, echo, logprobs 1; REQUESTS requests x
# PROMPTS prompts x TOKENS tokens per client) against `bench`'s forward rate on the same
# synthetic checkpoint (default Llama-3-8B W4A16-g128) and GPU, both at the same batch
# (--max-batch-tokens BATCH; `bench --ctx TOKENS --batch BATCH/TOKENS`) and `bench` also at
# EVAL_BATCH tokens. For each client count in CLIENTS: one warm-up load, then REPEAT loads
# (their median), each of prompts of its own (the prefix cache finds nothing); a server is only as busy as its clients keep it, so a few clients leave it
# waiting between their requests.
#   [SHAPE=.. SCHEME=.. BACKEND=cuda BATCH=16384 EVAL_BATCH=65536 CLIENTS="8 32" REPEAT=3] \
#       benches/serve_vs_eval.sh QUANTPPL TOKENIZER OUT
set -euo pipefail
Q=$1; TOK=$2; OUT=$3
SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; BACKEND=${BACKEND:-cuda}
BATCH=${BATCH:-16384}; EVAL_BATCH=${EVAL_BATCH:-65536}; CLIENTS=${CLIENTS:-8 32}
REPEAT=${REPEAT:-3}; REQUESTS=${REQUESTS:-8}; PROMPTS=${PROMPTS:-2}; TOKENS=${TOKENS:-512}
PORT=${PORT:-8765}
HERE=$(cd "$(dirname "$0")" && pwd)
M=${WORK:-/tmp}/quantppl-bench/$SHAPE-$SCHEME
mkdir -p "$OUT" "$(dirname "$M")"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --seed 0 --out "$M" -q
for b in "$BATCH" "$EVAL_BATCH"; do
    "$Q" bench --model "$M" --backend "$BACKEND" --ctx "$TOKENS" --batch $((b / TOKENS)) \
        --iters 5 --json "$OUT/bench-$b.json" > "$OUT/bench-$b.log" 2>&1
done
VOCAB=$(python3 -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")
"$Q" serve --model "$M" --tokenizer "$TOK" --backend "$BACKEND" --port "$PORT" \
    --max-batch-tokens "$BATCH" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null 2>&1 && break
    kill -0 $SERVER 2>/dev/null || { echo "serve exited:"; tail -5 "$OUT/serve.log"; exit 1; }
    sleep 1
done
for c in $CLIENTS; do
    for r in $(seq 0 "$REPEAT"); do
        python3 "$HERE/serve_load.py" --url "http://127.0.0.1:$PORT" --clients "$c" \
            --requests "$REQUESTS" --prompts "$PROMPTS" --tokens "$TOKENS" --vocab "$VOCAB" \
            --seed $((1000 * c + r)) > "$OUT/load-$c-$r.txt"
    done
done
python3 - "$OUT" "$BATCH" "$EVAL_BATCH" "$REPEAT" $CLIENTS <<'PY'
import json, re, statistics, sys
out, batch, eval_batch, repeat, clients = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
bench = {b: json.load(open(f"{out}/bench-{b}.json"))["tokens_per_second"] for b in (batch, eval_batch)}
print("| serve clients | scored tokens/s (median; runs) | / bench same batch | / bench at its batch |")
print("|---|---|---|---|")
for c in clients:
    runs = [float(re.search(r"scored tokens/s (\d+)", open(f"{out}/load-{c}-{r}.txt").read()).group(1))
            for r in range(1, repeat + 1)]
    m = statistics.median(runs)
    print(f"| {c} | {m:,.0f} ({' / '.join(f'{x:,.0f}' for x in runs)}) | "
          f"{m / bench[batch]:.3f}x | {m / bench[eval_batch]:.3f}x |")
print(f"bench: {bench[batch]:,.0f} tokens/s at {batch} tokens a batch, "
      f"{bench[eval_batch]:,.0f} at {eval_batch}")
PY
