"""A GLM-5.3-Flash-shaped slice for the speed benches (docs/performance.md), since `synth` has no
GLM-5.3-Flash shape: transformers' `Glm5NextTextConfig` defaults (hidden 4096; Kimi Delta
Attention of 64 heads of 128 under the safe gate; latent attention without RoPE, 64 heads of
256, query rank 1536, KV rank 512, an indexer of 32 heads of 128 keeping 2048 tokens in pools
of 16; 288 experts of 2048 with 8 a token and a shared one; 4 streams; vocabulary 154,880) with
the layers named by `--layer-types` and `--mlp-layer-types`, behind a one-layer vision tower
(the checkpoint's class, `Glm5NextForConditionalGeneration`; quantppl does not read it), random
weights (transformers' init; selection biases 0.05 N(0, 1)), written in bf16 by save_pretrained.

usage: python3 benches/glm5_next_slice.py OUT_DIR
       [--layer-types linear_attention,indexed_attention] [--mlp-layer-types sparse,sparse]
       [--seed 0]
Needs transformers >= 5.23; the weights are built on the GPU where there is one.
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layer-types", default="linear_attention,indexed_attention")
    p.add_argument("--mlp-layer-types", default="sparse,sparse")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default="{}", help="JSON of text config values to change (tests)")
    a = p.parse_args()
    layers = a.layer_types.split(",")
    text = dict(num_hidden_layers=len(layers), layer_types=layers,
                mlp_layer_types=a.mlp_layer_types.split(","),
                indexer_types=["full"] * len(layers), **json.loads(a.config))
    vision = dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=64,
                  projection_intermediate_size=64)
    config = Glm5NextConfig(text_config=text, vision_config=vision)
    torch.manual_seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Glm5NextForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(a.seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    out = Path(a.out)
    model.save_pretrained(out)
    print(f"{out}: {sum(t.numel() for t in model.parameters()) / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
