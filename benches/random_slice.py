"""What the random-weight slice builders (benches/deepseek_v4_slice.py, glm5_next_slice.py)
share: their command line and the model built, seeded and saved."""

import argparse
import json
from pathlib import Path

import torch


def arguments(layer_types, mlp_layer_types, extra=()):
    """The command line: OUT_DIR, `--layer-types` and `--mlp-layer-types` (comma-separated, these
    defaults), `--seed`, `--config` (JSON of config values to change, for tests) and the options
    `extra` names."""
    p = argparse.ArgumentParser()
    p.add_argument("out")
    for option in extra:
        p.add_argument(option)
    p.add_argument("--layer-types", default=layer_types)
    p.add_argument("--mlp-layer-types", default=mlp_layer_types)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default="{}", help="JSON of config values to change (tests)")
    a = p.parse_args()
    a.layer_types, a.mlp_layer_types = a.layer_types.split(","), a.mlp_layer_types.split(",")
    a.config = json.loads(a.config)
    return a


def build(cls, config, seed, buffers):
    """`cls` of `config` in bf16 with transformers' init under `seed`, on the GPU where there is
    one (a CPU takes minutes over billions of weights); `buffers(name, buffer, generator)` sets
    what the init leaves (selection biases, hash tables). Returns the model and its device."""
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = cls._from_config(config, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            buffers(name, b, g)
    return model, device


def save(model, out):
    """`model` written by save_pretrained to `out` (a Path)."""
    model.save_pretrained(out)
    print(f"{out}: {sum(t.numel() for t in model.parameters()) / 1e9:.2f}B parameters")


def selection_biases(name, b, g):
    """Routers' selection biases 0.05 N(0, 1) (transformers' init leaves zeros)."""
    if name.endswith("e_score_correction_bias"):
        b.copy_(0.05 * torch.randn(b.shape, generator=g))
