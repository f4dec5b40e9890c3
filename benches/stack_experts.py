"""Writes a copy of a Gemma 4 checkpoint whose per-expert linears
(`layers.N.experts.E.{gate,up,down}_proj.weight`, as llm-compressor and `quantppl synth` write
them) are stacked as transformers' Gemma4TextExperts holds them (`layers.N.experts.gate_up_proj`
[E, 2I, H], gate rows then up rows; `layers.N.experts.down_proj` [E, H, I]): transformers reads
only that layout. Dense (bf16) checkpoints only. Every other tensor and file is copied as is.

Usage: python3 benches/stack_experts.py SRC_DIR DST_DIR
"""

import json
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
        shutil.copy(f, dst / f.name)
per_expert = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
kept, experts = {}, defaultdict(dict)
for shard in sorted(src.glob("*.safetensors")):
    with safe_open(shard, "pt") as f:
        for name in f.keys():
            m = per_expert.match(name)
            if m:
                experts[m.group(1)][(int(m.group(2)), m.group(3))] = f.get_tensor(name)
            else:
                kept[name] = f.get_tensor(name)
for prefix, parts in experts.items():
    n = 1 + max(e for e, _ in parts)
    kept[f"{prefix}.gate_up_proj"] = torch.stack(
        [torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(n)]
    )
    kept[f"{prefix}.down_proj"] = torch.stack([parts[(e, "down")] for e in range(n)])
save_file({k: v.contiguous() for k, v in kept.items()}, dst / "model.safetensors", {"format": "pt"})
print(json.dumps({"stacked": len(experts), "tensors": len(kept)}))
