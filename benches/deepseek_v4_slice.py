"""A DeepSeek-V4-Flash-shaped slice for the speed benches (docs/performance.md), since `synth`
has no V4 shape: transformers' `DeepseekV4Config` defaults (V4-Flash: hidden 4096, 64 heads of
512 over one key/value head, query rank 1024, output in 8 groups of rank 1024, 256 experts of
2048 with 6 a token and a shared one, an indexer of 64 heads of 128 keeping 512 entries,
windows of 128, 4 streams, vocabulary 129,280) with the layers named by `--layer-types` and
`--mlp-layer-types`, random weights (transformers' init; a random hash table, two experts a
token drawn without repeats, as published tables are; selection biases 0.05 N(0, 1)), written
in bf16 by save_pretrained under DeepSeek's names. With `--fp4 DIR`, the same weights also in
DeepSeek-V4's published format (each routed expert FP4 under E8M0 scales per 32, beside
`.scale`; `quant_method: fp8`, `scale_fmt: ue8m0`, `expert_dtype: fp4`; every other linear
stays bf16, listed in `modules_to_not_convert`).

usage: python3 benches/deepseek_v4_slice.py OUT_DIR [--fp4 FP4_DIR]
       [--layer-types compressed_sparse_attention,heavily_compressed_attention]
       [--mlp-layer-types hash_moe,moe] [--seed 0]
Needs transformers >= 5.23 (DeepseekV4ForCausalLM); the weights are built on the GPU where
there is one (transformers' init of a 2-layer slice's 14B parameters took minutes on 16 CPU
cores).
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

from random_slice import arguments, build, save, selection_biases

# Midpoints of the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: a magnitude's code is how many
# lie below it.
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def fp4_e8m0(w):
    """DeepSeek-V4's FP4 expert weight of `w` [out, in]: E2M1 codes per group of 32 inputs under
    an E8M0 scale (amax / 6 rounded up to a power of two), two a byte (the even input low) as
    int8, the scales as float8_e8m0fnu (tests/fixtures/make_attention_fixtures.py's
    `quantize_v4_fp4`, a midpoint rounded down rather than to even)."""
    out, n_in = w.shape
    g = w.float().reshape(out, n_in // 32, 32)
    s = torch.exp2(torch.ceil(torch.log2((g.abs().amax(-1) / 6.0).clamp(min=2.0**-126))))
    y = (g / s[..., None]).clamp(-6, 6)
    mag = torch.bucketize(y.abs(), E2M1_MIDPOINTS.to(y.device))
    nib = (mag | ((y < 0).to(torch.int64) << 3)).reshape(out, n_in)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, s.to(torch.float8_e8m0fnu)


def main():
    a = arguments("compressed_sparse_attention,heavily_compressed_attention", "hash_moe,moe",
                  extra=("--fp4",))
    config = DeepseekV4Config(num_hidden_layers=len(a.layer_types), layer_types=a.layer_types,
                              mlp_layer_types=a.mlp_layer_types, num_nextn_predict_layers=0,
                              **a.config)

    def buffers(name, b, g):
        # A hash table of two experts a token drawn without repeats, as published tables are.
        if name.endswith("tid2eid"):
            rows, k = b.shape
            b.copy_(torch.stack([torch.randperm(config.n_routed_experts, generator=g)[:k]
                                 for _ in range(rows)]))
        selection_biases(name, b, g)

    model, device = build(DeepseekV4ForCausalLM, config, a.seed, buffers)
    out = Path(a.out)
    save(model, out)
    if not a.fp4:
        return
    dense = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    del model
    fp4 = Path(a.fp4)
    fp4.mkdir(parents=True, exist_ok=True)
    index = out / "model.safetensors.index.json"
    shards = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
              if index.exists() else ["model.safetensors"])
    weight_map = {}
    for shard in shards:
        tensors = {}
        with safe_open(out / shard, "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if ".experts." in name and name.endswith(".weight") and t.dim() == 2:
                    module = name.removesuffix(".weight")
                    codes, scales = fp4_e8m0(t.to(device))
                    tensors[name], tensors[f"{module}.scale"] = codes.cpu(), scales.cpu()
                else:
                    tensors[name] = t
        save_file(tensors, fp4 / shard, metadata={"format": "pt"})
        weight_map.update({n: shard for n in tensors})
    if index.exists():
        (fp4 / index.name).write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n")
    c = json.loads((out / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
                                "modules_to_not_convert": dense}
    c["expert_dtype"] = "fp4"
    (fp4 / "config.json").write_text(json.dumps(c, indent=1) + "\n")
    for extra in ("generation_config.json",):
        if (out / extra).exists():
            shutil.copy(out / extra, fp4 / extra)
    print(f"{fp4}: the routed experts in FP4")


if __name__ == "__main__":
    main()
