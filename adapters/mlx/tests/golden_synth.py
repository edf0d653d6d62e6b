"""Stand-in model directories for the golden replay's tests (until `kvlab golden models`
writes the real ones): mlx-lm's own Model class from a config, its random initial
weights scaled so greedy decoding does not collapse into one repeated token, saved with
mlx-lm's parameter names beside config.json.

    python tests/golden_synth.py CONFIG.json OUTDIR [SEED]
"""

from __future__ import annotations

import json
import os
import sys

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

# Matrices ×4, embeddings ×¼: with mlx's initialisers, llama and gemma4_text (softcap 30,
# tied embeddings) then give 20+ distinct tokens out of 24 greedy steps.
LINEAR_SCALE, EMBED_SCALE = 4.0, 0.25


def make_model_dir(config, out, seed: int = 1) -> str:
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    params = {}
    for name, value in tree_flatten(model.parameters()):
        if value.ndim >= 2:
            value = value * (EMBED_SCALE if "embed" in name else LINEAR_SCALE)
        params[name] = value
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    mx.save_safetensors(os.path.join(out, "model.safetensors"), params)
    return str(out)


if __name__ == "__main__":
    make_model_dir(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
