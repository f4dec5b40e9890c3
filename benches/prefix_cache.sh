#!/usr/bin/env bash
# docs/performance.md "`serve`'s prefix cache": two servers on the same synthetic checkpoint
# (default Llama-3-8B W4A16-g128) and GPU, one with the prefix cache off, one with it on
# (--prefix-cache-mb CACHE_MB), under benches/serve_load.py loads of multiple-choice shape
# (contexts of SHARED tokens, 4 choices to 512 tokens; the choices of a context in one request
# (lag 0) or spread over requests LAG apart, as lm-eval's length-sorted order spreads them),
# and one without shared starts (what keeping keys and values costs). Alternates the servers,
# REPEAT rounds each; then compares both servers' answers to the same requests.
#   [SHAPE=.. SCHEME=.. BACKEND=cuda DTYPE=auto CACHE_MB=16384 LAG=8 REPEAT=3] \
#       benches/prefix_cache.sh QUANTPPL TOKENIZER OUT
# REPEAT=0 compares the answers only.
set -euo pipefail
Q=$1; TOK=$2; OUT=$3
SHAPE=${SHAPE:-llama3-8b}; SCHEME=${SCHEME:-w4a16-g128}; BACKEND=${BACKEND:-cuda}
CACHE_MB=${CACHE_MB:-16384}; REPEAT=${REPEAT:-3}; LAG=${LAG:-8}; SHARED=${SHARED:-448}
DTYPE=${DTYPE:-auto}
HERE=$(cd "$(dirname "$0")" && pwd)
M=${WORK:-/tmp}/quantppl-bench/$SHAPE-$SCHEME
mkdir -p "$OUT" "$(dirname "$M")"
[ -d "$M" ] || "$Q" synth --shape "$SHAPE" --scheme "$SCHEME" --seed 0 --out "$M" -q
VOCAB=$(python3 -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null' EXIT
start() { # PORT CACHE_MB
    "$Q" serve --model "$M" --tokenizer "$TOK" --backend "$BACKEND" --dtype "$DTYPE" --port "$1" \
        --max-batch-tokens 16384 --prefix-cache-mb "$2" > "$OUT/serve-$1.log" 2>&1 &
    PIDS+=($!)
}
start 8771 0
start 8772 "$CACHE_MB"
for port in 8771 8772; do
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null 2>&1 && break
        sleep 1
    done
done
load() { # PORT NAME ARGS...
    local port=$1 name=$2; shift 2
    python3 "$HERE/serve_load.py" --url "http://127.0.0.1:$port" --clients 8 --requests 8 \
        --prompts 4 --tokens 512 --vocab "$VOCAB" "$@" | grep "scored tokens/s" \
        | sed -E "s/.*scored tokens\/s ([0-9]+).*/$name $port \1/" >> "$OUT/rates.txt"
}
: > "$OUT/rates.txt"
[ "$REPEAT" = 0 ] || { load 8771 warm; load 8772 warm; }
for r in $(seq "$REPEAT"); do
    for port in 8771 8772; do
        load $port distinct --seed $((10 + r))
        load $port together --shared "$SHARED" --seed $((20 + r))
        load $port "spread" --shared "$SHARED" --lag "$LAG" --seed $((30 + r))
    done
done
# The same requests to both, each prompt alone; and to the server without the cache with 3
# other prompts beside it (how much a batch's other rows move an answer at all).
python3 - "$VOCAB" "$SHARED" <<'PY' | tee "$OUT/agreement.txt"
import json, random, sys, urllib.request
vocab, shared = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(7)
contexts = [[rng.randrange(vocab) for _ in range(shared)] for _ in range(6)]
def ask(port, prompts):
    body = json.dumps({"prompt": prompts, "echo": True, "logprobs": 5, "max_tokens": 1}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    return [c["logprobs"] for c in json.load(urllib.request.urlopen(req, timeout=600))["choices"]]
def differ(a, b, tally):
    for x, y in zip(a["token_logprobs"][1:], b["token_logprobs"][1:]):
        d = abs(x - y)
        tally[0] = max(tally[0], d); tally[1] += d > 1e-3; tally[2] += 1
    tally[3] += sum(list(u) == list(v) for u, v in zip(a["top_logprobs"][1:], b["top_logprobs"][1:]))
cache, batch = [0.0, 0, 0, 0], [0.0, 0, 0, 0]
for k in range(24):
    prompt = contexts[k % 6] + [rng.randrange(vocab) for _ in range(64)]
    others = [[rng.randrange(vocab) for _ in range(300 + 50 * j)] for j in range(3)]
    alone = ask(8771, [prompt])[0]
    differ(alone, ask(8772, [prompt])[0], cache)
    differ(alone, ask(8771, others[:k % 3] + [prompt] + others[k % 3:])[k % 3], batch)
for name, (worst, over, n, same) in [("cache on against off", cache), ("off, other prompts beside", batch)]:
    print(f"agreement, {name}: {n} positions, max |logprob difference| {worst:.2e}, "
          f"{over} above 1e-3, top-5 lists identical at {same}")
PY
kill "${PIDS[@]}" 2>/dev/null || true
wait 2>/dev/null || true
grep -h "s scoring" "$OUT"/serve-*.log || true
python3 - "$OUT/rates.txt" <<'PY'
import collections, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, port, rate = line.split()
    if name != "warm":
        rates[(name, port)].append(int(rate))
print("| load | cache off (scored tokens/s) | cache on | ratio |")
print("|---|---|---|---|")
for name in ["distinct", "together", "spread"]:
    off, on = rates[(name, "8771")], rates[(name, "8772")]
    if off and on:
        print(f"| {name} | {statistics.median(off):,.0f} ({' / '.join(map(str, off))}) | "
              f"{statistics.median(on):,.0f} ({' / '.join(map(str, on))}) | "
              f"{statistics.median(on) / statistics.median(off):.2f}x |")
PY
