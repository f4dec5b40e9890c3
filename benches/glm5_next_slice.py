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

from pathlib import Path

from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

from random_slice import arguments, build, save, selection_biases


def main():
    a = arguments("linear_attention,indexed_attention", "sparse,sparse")
    layers = a.layer_types
    text = dict(num_hidden_layers=len(layers), layer_types=layers,
                mlp_layer_types=a.mlp_layer_types, indexer_types=["full"] * len(layers),
                **a.config)
    vision = dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=64,
                  projection_intermediate_size=64)
    config = Glm5NextConfig(text_config=text, vision_config=vision)
    model, _ = build(Glm5NextForConditionalGeneration, config, a.seed, selection_biases)
    save(model, Path(a.out))


if __name__ == "__main__":
    main()
