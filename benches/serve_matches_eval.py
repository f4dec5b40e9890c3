#!/usr/bin/env python3
"""Serve's echo logprobs against eval's NLLs of the same windows, on one device.

    benches/serve_matches_eval.py QUANTPPL MODEL [--backend cuda] [--dtype bf16]

Runs `eval --method gptq --ctx 128 --rows 2 --dump-nll` on MODEL, then `serve` on the same
backend and precision, sends both windows and the second window's first half in one request
(three prompts of two lengths in one batch), and prints the largest |served logprob + eval
NLL| and how many positions differ by more than 1e-3. Standard library only.
"""
import argparse, json, os, subprocess, tempfile, time, urllib.request

a = argparse.ArgumentParser()
a.add_argument("quantppl")
a.add_argument("model")
a.add_argument("--backend", default="cuda")
a.add_argument("--dtype", default="bf16")
a.add_argument("--port", type=int, default=8123)
args = a.parse_args()
device = ["--backend", args.backend] + (["--dtype", args.dtype] if args.backend == "cuda" else [])
with tempfile.TemporaryDirectory() as tmp:
    dump = os.path.join(tmp, "nll.jsonl")
    subprocess.run([args.quantppl, "eval", *device, "--model", args.model, "--method", "gptq",
                    "--ctx", "128", "--rows", "2", "-q", "--dump-nll", dump],
                   check=True, stdout=subprocess.DEVNULL)
    windows = [json.loads(line) for line in open(dump)]
server = subprocess.Popen([args.quantppl, "serve", *device, "--model", args.model, "-q",
                           "--port", str(args.port)], stderr=subprocess.DEVNULL)
url = f"http://127.0.0.1:{args.port}"
try:
    for _ in range(240):
        try:
            urllib.request.urlopen(url + "/health")
            break
        except OSError:
            time.sleep(0.5)
    ids = [w["ids"] for w in windows]
    body = {"prompt": ids + [ids[1][:64]], "echo": True, "logprobs": 1, "max_tokens": 0}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req))
finally:
    server.terminate()
    server.wait()
diffs = [abs(lp + nll)
         for k, choice in enumerate(answer["choices"])
         for lp, nll in zip(choice["logprobs"]["token_logprobs"][1:], windows[min(k, 1)]["nll"])]
where = args.backend + (f" {args.dtype}" if args.backend == "cuda" else "")
print(f"{os.path.basename(args.model.rstrip('/'))} {where}: max "
      f"|served logprob + eval NLL| {max(diffs):.3e} over {len(diffs)} positions, "
      f"{sum(d > 1e-3 for d in diffs)} beyond 1e-3")
