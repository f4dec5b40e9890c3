#!/usr/bin/env bash
# docs/performance.md "`serve`": scored tokens/s of `quantppl serve` under benches/serve_load.py
# (8 clients x 4 requests x 2 prompts x 512 tokens, echo, logprobs 1) against `bench`'s
# tokens/s on the same synthetic checkpoint (default Llama-3-8B W4A16-g128) and GPU.
#   [SHAPE=.. SCHEME=.. BACKEND=cuda PORT=8765] benches/serve_vs_eval.sh QUANTPPL TOKENIZER OUT
set -euo pipefail
Q=$1; TOK=$2; OUT=$3
SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; BACKEND=${BACKEND:-cuda}
PORT=${PORT:-8765}
HERE=$(cd "$(dirname "$0")" && pwd)
M=${WORK:-/tmp}/quantppl-bench/$SHAPE-$SCHEME
mkdir -p "$OUT" "$(dirname "$M")"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --seed 0 --out "$M" -q
"$Q" bench --model "$M" --backend "$BACKEND" --ctx 2048 --batch 4 --iters 3 \
    --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
VOCAB=$(python3 -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")
"$Q" serve --model "$M" --tokenizer "$TOK" --backend "$BACKEND" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null 2>&1 && break
    kill -0 $SERVER 2>/dev/null || { echo "serve exited:"; tail -5 "$OUT/serve.log"; exit 1; }
    sleep 1
done
python3 "$HERE/serve_load.py" --url "http://127.0.0.1:$PORT" --clients 8 --requests 4 \
    --prompts 2 --tokens 512 --vocab "$VOCAB" | tee "$OUT/serve_load.txt"
python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
bench = json.load(open(f"{out}/bench.json"))["tokens_per_second"]
serve = float(re.search(r"scored tokens/s (\d+)", open(f"{out}/serve_load.txt").read()).group(1))
print(f"serve {serve:,.0f} scored tokens/s, bench {bench:,.0f} tokens/s: {serve / bench:.3f}x")
PY
