#!/usr/bin/env python3
"""llama-perplexity's CPU backend against quantppl's CPU reference on one GGUF file and on the
same weights dequantized to F32 (docs/performance.md, "the files' exact perplexity").

llama.cpp's CPU matmuls quantize the activations (to Q8_K or Q8_0) for quantized weights and
multiply F32 weights in f32: on the F32 file both tools compute the same f32 model, on the
quantized one llama.cpp's number moves by its activations' rounding while quantppl's (weights
decoded bit for bit) equals its F32 one.

    benches/llamacpp_cpu_exact.py --llama-bin DIR --quantppl Q --model M.gguf --out OUT \\
        [--vocab-of-llama-cpp SRC] [--ctx 512] [--chunks 40]

DIR holds llama.cpp's CPU build (llama-perplexity, llama-quantize; `benches/llamacpp_compare.sh
build-vulkan` builds the latter, or cmake with GGML_CUDA off). The test fixtures' vocabularies
have flat scores, which quantppl refuses (llama.cpp then merges leftmost first): with
`--vocab-of-llama-cpp SRC` (llama.cpp's source, for its converter) a 512-piece SentencePiece
BPE vocabulary with scores is trained on wiki.test.raw (`make_gguf_fixtures.spm_vocab_gguf`)
and written into both files in place of the model's. Runs in the fixture scripts' environment
(it uses their GGUF helpers).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/fixtures"))
import make_gguf_fixtures as fixtures  # noqa: E402  (the fixture scripts' GGUF helpers)


def rewritten(src, dst, vocab):
    """`src` written to `dst` with the `tokenizer.*` metadata of `vocab`, tensors as they are."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    fixtures.copy_metadata(r, w, lambda k: not k.startswith("tokenizer."))
    fixtures.copy_metadata(vocab, w, lambda k: k.startswith("tokenizer."))
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(t.data.shape),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-bin", required=True, type=Path)
    p.add_argument("--quantppl", required=True)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--text", type=Path, default=ROOT / "assets/wikitext-2-raw/wiki.test.raw")
    p.add_argument("--vocab-of-llama-cpp", type=Path)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=40)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(a.llama_bin)}
    model = a.model
    if a.vocab_of_llama_cpp:
        model = a.out / "model.gguf"
        fixtures.spm_vocab_gguf(a.out / "spm", a.out / "vocab.gguf", a.vocab_of_llama_cpp, 512,
                                0.99)
        rewritten(a.model, model, gguf.GGUFReader(str(a.out / "vocab.gguf")))
    f32 = a.out / "f32.gguf"
    subprocess.run([str(a.llama_bin / "llama-quantize"), "--allow-requantize", str(model),
                    str(f32), "F32", "1"], check=True, env=env, capture_output=True)
    rows = []
    for name, path in (("quantized", model), ("F32", f32)):
        log = subprocess.run(
            [str(a.llama_bin / "llama-perplexity"), "-m", str(path), "-f", str(a.text), "-c",
             str(a.ctx), "--chunks", str(a.chunks), "-t", str(os.cpu_count())],
            check=True, env=env, capture_output=True, text=True)
        final = [l for l in (log.stdout + log.stderr).splitlines() if "Final estimate" in l][0]
        lc = [float(x) for x in final.split("PPL = ")[1].split(" +/- ")]
        report = a.out / f"quantppl_{name}.json"
        subprocess.run([a.quantppl, "eval", "--model", str(path), "--data", str(a.text),
                        "--method", "llamacpp", "--ctx", str(a.ctx), "--rows", str(a.chunks),
                        "--backend", "cpu", "-q", "--json", str(report)],
                       check=True, capture_output=True)
        q = json.loads(report.read_text())
        rows.append((name, lc[0], lc[1], q["ppl"], q["ppl_stderr"]))
    print(f"{'file':<10}{'llama.cpp PPL':>16}{'+/-':>12}{'quantppl PPL':>16}{'+/-':>12}{'rel diff':>10}")
    for name, lp, ls, qp, qs in rows:
        print(f"{name:<10}{lp:>16.4f}{ls:>12.4f}{qp:>16.4f}{qs:>12.4f}{abs(qp / lp - 1):>10.2e}")


if __name__ == "__main__":
    main()
