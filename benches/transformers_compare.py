"""The same exl3 windows through transformers + compressed-tensors, for docs/performance.md.

Reproduces what `quantppl eval --method exl3` scores: the text tokenized with add_special_tokens
(one BOS), rows T[a:a+ctx] for a in range(0, len(T)-ctx, stride), the first `rows` of them,
every position but the last scored against the next token, PPL = exp(mean NLL) over all
scored tokens. The model is loaded the way transformers does by default for a compressed
checkpoint (decompressed to the checkpoint dtype on the GPU), so the peak memory and speed are
what a user of that path sees; one untimed batch runs first. Prints one JSON object; its `tool`
names the optional kernel packages (flash-linear-attention, causal-conv1d, mamba-ssm) that
transformers found.

usage: python3 transformers_compare.py MODEL_DIR TOKENIZER_JSON TEXT_FILE [--ctx 2048]
       [--stride 512] [--rows 200] [--batch 4] [--device-map cuda|auto|cpu] [--dequantize]
       [--dtype bfloat16|float32] [--upcast] [--eager] [--dump-nll FILE]

--upcast (with --dtype float32): load in the checkpoint's dtype, decompress, then cast every
tensor to float32 — the fixtures' reference (tests/fixtures/README.md), whose weights are
rounded as compressed-tensors rounds them in the checkpoint's dtype. A plain float32 load
upcasts the scales first and multiplies them unrounded, another model (3e-4 to 1e-2 in PPL).

--dump-nll writes every row's NLLs as `quantppl eval --dump-nll` does (JSON Lines: window, ids,
positions, nll), for benches/nll_compare.py. float32 runs with TF32 off (matmuls and cuDNN):
the float32 reference, not its fast approximation.
"""

import argparse
import json
import math
import sys
import time

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


# The optional kernel packages transformers uses for hybrid layers when they are installed
# (module, distribution): without them it runs its torch fallbacks.
KERNEL_PACKAGES = [("fla", "fla-core"), ("causal_conv1d", "causal-conv1d"), ("mamba_ssm", "mamba-ssm")]


def tool_name(method):
    """transformers' version, compressed-tensors' where it read the checkpoint, and every
    optional kernel package that imports."""
    import importlib
    import importlib.metadata

    name = "transformers " + __import__("transformers").__version__
    if method == "compressed-tensors":
        name += " + compressed-tensors " + __import__("compressed_tensors").__version__
    for module, dist in KERNEL_PACKAGES:
        try:
            importlib.import_module(module)
            name += f" + {dist} {importlib.metadata.version(dist)}"
        except Exception:
            pass
    return name


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("tokenizer")
    p.add_argument("text")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--stride", type=int, default=512)
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--device-map", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--eager",
        action="store_true",
        help="eager attention (and eager experts where the version has the option): the "
        "reference implementation instead of the default kernels",
    )
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="decompress while loading (CompressedTensorsConfig(dequantize=True)); needed with "
        "--device-map auto, where the default first-forward decompression hook clashes with "
        "accelerate's dispatch hooks",
    )
    p.add_argument("--upcast", action="store_true",
                   help="load in the checkpoint dtype, decompress, then cast to --dtype")
    p.add_argument("--dump-nll", help="per-token NLLs as JSON Lines (quantppl's --dump-nll)")
    a = p.parse_args()
    # `--device-map cpu`: a small model's reference on the CPU, no GPU timings or memory.
    gpu = a.device_map != "cpu"

    def sync():
        if gpu:
            torch.cuda.synchronize()

    if a.dtype == "float32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    with open(a.text, encoding="utf-8", newline="") as f:
        text = f.read()
    ids = Tokenizer.from_file(a.tokenizer).encode(text, add_special_tokens=True).ids
    starts = list(range(0, len(ids) - a.ctx, a.stride))[: a.rows]
    rows = torch.tensor([ids[s : s + a.ctx] for s in starts], dtype=torch.long)

    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    extra = {}
    method = json.load(open(f"{a.model}/config.json")).get("quantization_config", {}).get(
        "quant_method"
    )
    if method == "mxfp4":
        # gpt-oss's MXFP4 experts: dequantized to bf16 while loading (transformers' own
        # convert_moe_packed_tensors), the path it takes without the triton `kernels` package.
        from transformers import Mxfp4Config

        extra["quantization_config"] = Mxfp4Config(dequantize=True)
    elif a.dequantize:
        from transformers import CompressedTensorsConfig

        extra["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    if a.eager:
        extra["attn_implementation"] = "eager"
        extra["experts_implementation"] = "eager"
    load_dtype = "auto" if a.upcast else getattr(torch, a.dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            a.model, dtype=load_dtype, device_map=a.device_map, **extra
        )
    except ValueError as e:
        # Multimodal classes no causal-LM mapping lists (GLM-5.3-Flash's): their own class.
        if "Unrecognized configuration class" not in str(e):
            raise
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(
            a.model, dtype=load_dtype, device_map=a.device_map, **extra
        )
    model.eval()
    # accelerate puts what the GPUs cannot hold on the CPU or disk: that would time offloading.
    offloaded = {str(d) for d in getattr(model, "hf_device_map", {}).values()} & {"cpu", "disk"}
    if offloaded:
        sys.exit(f"{a.model}: device_map={a.device_map} put modules on {', '.join(sorted(offloaded))}"
                 f" ({torch.cuda.device_count()} GPUs too small for it)")
    first = next(model.parameters()).device
    # One forward decompresses the packed weights (compressed-tensors' hook); not timed below.
    # (no_grad, not inference_mode: the decompressed weights may be cast afterwards.) Then one
    # untimed batch of the timed shape: Triton kernels (flash-linear-attention's) compile and
    # autotune at their first shapes.
    with torch.no_grad():
        model(rows[:1, :16].to(first))
    if not a.upcast:
        with torch.inference_mode():
            model(rows[: a.batch].to(first))
    if a.upcast:
        model.to(getattr(torch, a.dtype))
    sync()
    load_s = time.perf_counter() - t0

    nll_sum, count = 0.0, 0
    dump = open(a.dump_nll, "w") if a.dump_nll else None
    sync()
    t1 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(rows), a.batch):
            x = rows[i : i + a.batch].to(first)
            logits = model(x).logits[:, :-1, :].float()
            lp = torch.log_softmax(logits, dim=-1)
            tgt = x[:, 1:].to(lp.device)
            nll = -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            nll_sum += nll.double().sum().item()
            count += nll.numel()
            if dump:
                for j, row in enumerate(nll.tolist()):
                    w = i + j
                    line = {"window": w, "ids": rows[w].tolist(),
                            "positions": list(range(len(row))), "nll": row}
                    dump.write(json.dumps(line) + "\n")
            del logits, lp
    sync()
    eval_s = time.perf_counter() - t1
    if dump:
        dump.close()
    devices = torch.cuda.device_count() if gpu else 0
    peak = max((torch.cuda.max_memory_allocated(d) for d in range(devices)), default=0)
    print(
        json.dumps(
            {
                "tool": tool_name(method),
                "ppl": math.exp(nll_sum / count),
                "scored_tokens": count,
                "windows": len(rows),
                "load_and_decompress_seconds": load_s,
                "eval_seconds": eval_s,
                "tokens_per_second": len(rows) * a.ctx / eval_s,
                "peak_gpu_memory_bytes": peak,
                "devices": devices,
                "batch": a.batch,
            }
        )
    )


if __name__ == "__main__":
    main()
