"""Load on `quantppl serve`: N clients send lm-eval-shaped loglikelihood requests (token-id
prompts, echo, logprobs 1, max_tokens 1) at once; prints requests/s, scored tokens/s and
latencies. Python standard library only (runs on the GPU machine as it is).

    python3 benches/serve_load.py --url http://127.0.0.1:8000 --clients 8 --requests 16 \
        --prompts 4 --tokens 512 --vocab 128256
"""

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16, help="per client")
    ap.add_argument("--prompts", type=int, default=4, help="per request")
    ap.add_argument("--tokens", type=int, default=512, help="per prompt")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    bodies = [
        json.dumps({
            "prompt": [[rng.randrange(a.vocab) for _ in range(a.tokens)] for _ in range(a.prompts)],
            "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0,
        }).encode()
        for _ in range(a.clients * a.requests)
    ]
    latencies, errors = [], []
    lock = threading.Lock()

    def client(c):
        for r in range(a.requests):
            body = bodies[c * a.requests + r]
            req = urllib.request.Request(a.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    out = json.load(resp)
                assert len(out["choices"]) == a.prompts
            except Exception as e:  # noqa: BLE001 - counted and printed
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    done = len(latencies)
    scored = done * a.prompts * (a.tokens - 1)
    print(f"clients {a.clients}, {done} requests of {a.prompts} x {a.tokens} tokens in {wall:.2f} s, "
          f"{len(errors)} errors")
    print(f"requests/s {done / wall:.2f}; scored tokens/s {scored / wall:.0f}; "
          f"latency p50 {statistics.median(latencies):.3f} s, "
          f"p95 {sorted(latencies)[int(0.95 * (done - 1))]:.3f} s")
    if errors:
        print("first error:", errors[0])


if __name__ == "__main__":
    main()
