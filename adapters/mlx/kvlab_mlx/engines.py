"""The engines whose cache classes the cache replay drives, chosen by name.

Each engine gives its cache module, the mask and attention functions its model layers
call, and its own save → load route for the script's `s` command, so a script means the
same steps in every engine. Kinds an engine has no driver for yet are listed with the
reason (the replay reports them UNSUPPORTED, never compares them with a stand-in).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Engine:
    name: str
    package: str  # the top-level module: an exception raised inside it is the engine's
    cache: types.ModuleType
    create_attention_mask: Callable
    sdpa: Callable
    save_load: Callable
    not_driven: dict = field(default_factory=dict)


def _mlx_lm():
    from mlx_lm.models import cache
    from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

    def save_load(c):
        """mlx-lm's own prompt-cache file round trip: save_prompt_cache, load_prompt_cache."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "cache.safetensors")
            cache.save_prompt_cache(path, [c])
            return cache.load_prompt_cache(path)[0]

    return Engine("mlx-lm", "mlx_lm", cache, create_attention_mask, scaled_dot_product_attention, save_load,
                  {"turboquant": "mlx-lm has no TurboQuant cache",
                   "batch_quantized": "mlx-lm has no batched quantized cache"})


def _mlx_vlm():
    # mlx_vlm/__init__ imports transformers, opencv and more; its cache and attention code
    # needs only mlx (and PIL): load the two subpackages under stub parents.
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None:
        raise ImportError("mlx-vlm is not installed in this venv (tools/setup_venv.sh)")
    if "mlx_vlm" not in sys.modules:
        root = spec.submodule_search_locations[0]
        pkg = types.ModuleType("mlx_vlm")
        pkg.__path__ = [root]
        models = types.ModuleType("mlx_vlm.models")
        models.__path__ = [os.path.join(root, "models")]
        sys.modules["mlx_vlm"], sys.modules["mlx_vlm.models"] = pkg, models
    from mlx_vlm.models import cache
    from mlx_vlm.models.base import create_attention_mask, scaled_dot_product_attention

    def save_load(c):
        """mlx-vlm has no prompt-cache files: its state and meta_state, and from_state."""
        import mlx.core as mx

        state, meta = c.state, c.meta_state
        mx.eval(state)
        return type(c).from_state(state, meta)

    return Engine("mlx-vlm", "mlx_vlm", cache, create_attention_mask, scaled_dot_product_attention, save_load,
                  {"turboquant": "the TurboQuant comparison with mlx-vlm is not written yet"})


_LOADERS = {"mlx-lm": _mlx_lm, "mlx-vlm": _mlx_vlm}


def names():
    return sorted(_LOADERS)


def load(name: str) -> Engine:
    if name not in _LOADERS:
        raise ValueError(f"unknown cache engine {name!r} (known: {', '.join(names())})")
    return _LOADERS[name]()
