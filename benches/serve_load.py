"""Load on `quantppl serve`: N clients send lm-eval-shaped loglikelihood requests (token-id
prompts, echo, logprobs 1 or --logprobs N, max_tokens 1; with --shared C the prompts of a
request start with the same C tokens) at once; prints requests/s, scored tokens/s and
latencies. With `--hostile H`, H more connections attack it meanwhile: a third stay idle, a
third send their headers a byte a second (slowloris), a third declare a body and never send
it; `/health` is probed twice a second throughout. Prints the probes' latency and how many
hostile connections the server closed (it should close them all after its --client-timeout
and keep answering). Python standard library only (runs on the GPU machine as it is).

    python3 benches/serve_load.py --url http://127.0.0.1:8000 --clients 8 --requests 16 \
        --prompts 4 --tokens 512 --vocab 128256 [--hostile 300]
"""

import argparse
import json
import random
import socket
import statistics
import threading
import time
import urllib.parse
import urllib.request


class Hostile:
    """H attacking connections and a /health prober, run beside the honest clients."""

    def __init__(self, url, count):
        u = urllib.parse.urlparse(url)
        self.addr = (u.hostname, u.port or 80)
        self.url = url
        self.count = count
        self.socks = []
        self.health = []
        self.health_errors = 0
        self.stop = threading.Event()

    def start(self):
        for i in range(self.count):
            try:
                s = socket.create_connection(self.addr, timeout=5)
            except OSError:
                continue
            kind = i % 3
            if kind == 2:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            self.socks.append((kind, s))
        self.threads = [threading.Thread(target=self.slowloris), threading.Thread(target=self.probe)]
        for t in self.threads:
            t.start()

    def slowloris(self):
        line = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096
        at = 0
        while not self.stop.wait(1.0):
            for kind, s in self.socks:
                if kind == 1:
                    try:
                        s.send(line[at:at + 1])
                    except OSError:
                        pass
            at = min(at + 1, len(line) - 1)

    def probe(self):
        while not self.stop.wait(0.5):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=30) as r:
                    r.read()
                self.health.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - counted
                self.health_errors += 1

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        closed = 0
        for _, s in self.socks:
            s.setblocking(False)
            try:
                s.recv(4096)  # an answer (408) or the end of the stream
                closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            s.close()
        h = sorted(self.health) or [float("nan")]
        print(f"hostile: {len(self.socks)} connections (idle, slowloris, stalled body), "
              f"{closed} closed or answered by the server; /health {len(self.health)} probes, "
              f"{self.health_errors} failed, p50 {statistics.median(h):.3f} s, max {h[-1]:.3f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16, help="per client")
    ap.add_argument("--prompts", type=int, default=4, help="per request")
    ap.add_argument("--tokens", type=int, default=512, help="per prompt")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--logprobs", type=int, default=1, help="top list per position")
    ap.add_argument("--shared", type=int, default=0,
                    help="the first SHARED tokens of a request's prompts are the same (a "
                         "multiple-choice context sent once per choice)")
    ap.add_argument("--lag", type=int, default=0,
                    help="with --shared, prompt j of the request sent i-th continues the context "
                         "of the request sent (i - LAG*j)-th: a context's choices spread over "
                         "requests and batches, as lm-eval's length-sorted order spreads them; "
                         "0: a request's prompts are one context's choices")
    ap.add_argument("--hostile", type=int, default=0,
                    help="attacking connections beside the clients (idle, slowloris, stalled body)")
    ap.add_argument("--hold", type=float, default=0.0,
                    help="seconds to keep the attack on after the clients finish")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n = a.clients * a.requests
    contexts = [[rng.randrange(a.vocab) for _ in range(a.shared)] for _ in range(n)]

    def prompts(i):
        # Sent i-th: round i // clients of client i % clients.
        return [contexts[i - a.lag * j if i >= a.lag * j else i] +
                [rng.randrange(a.vocab) for _ in range(a.tokens - a.shared)]
                for j in range(a.prompts)]

    order = [r * a.clients + c for c in range(a.clients) for r in range(a.requests)]
    bodies = [
        json.dumps({
            "prompt": prompts(i),
            "echo": True, "logprobs": a.logprobs, "max_tokens": 1, "temperature": 0,
        }).encode()
        for i in order
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

    hostile = Hostile(a.url, a.hostile) if a.hostile else None
    if hostile:
        hostile.start()
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
    if hostile:
        time.sleep(a.hold)
        hostile.finish()


if __name__ == "__main__":
    main()
