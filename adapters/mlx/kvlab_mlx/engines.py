"""The engines whose cache classes the cache replay drives, chosen by name.

Each engine gives its cache module, the mask and attention functions its model layers
call, and its own save → load route for the script's `s` command, so a script means the
same steps in every engine. Kinds an engine has no driver for yet are listed with the
reason (the replay reports them UNSUPPORTED, never compares them with a stand-in). An
engine with a prefix store (vllm-mlx's, mlx-vlm's APC) drives the prefix verbs w, i, g through it.
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
    prefix_store: Callable | None = None  # () -> the engine's prefix cache, for w, i, g
    only_prefix: str | None = None  # why the engine replays prefix scripts only, if it does


def _file_round_trip(cache):
    """mlx-lm's own prompt-cache file round trip: save_prompt_cache, load_prompt_cache."""
    def save_load(c):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "cache.safetensors")
            cache.save_prompt_cache(path, [c])
            return cache.load_prompt_cache(path)[0]

    return save_load


def _mlx_lm():
    from mlx_lm.models import cache
    from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

    return Engine("mlx-lm", "mlx_lm", cache, create_attention_mask, scaled_dot_product_attention, _file_round_trip(cache),
                  {"turboquant": "mlx-lm has no TurboQuant cache",
                   "batch_quantized": "mlx-lm has no batched quantized cache"})


def _subpackages(top: str, dist: str, *subs: str):
    """Load `top`'s subpackages under a stub parent, without its package __init__ (which
    for mlx-vlm and mlx-lm 0.31.3 imports transformers, opencv and more): their cache and
    attention code needs only mlx."""
    if top in sys.modules:  # loaded before, stubbed or whole
        return
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ImportError(f"{dist} is not installed in this venv")
    root = spec.submodule_search_locations[0]
    for name in (top, *subs):
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules[name] = mod


def _mlx_vlm():
    _subpackages("mlx_vlm", "mlx-vlm (tools/setup_venv.sh)", "mlx_vlm.models")
    from mlx_vlm.models import cache
    from mlx_vlm.models.base import create_attention_mask, scaled_dot_product_attention

    def save_load(c):
        """mlx-vlm has no prompt-cache files: its state and meta_state, and from_state."""
        import mlx.core as mx

        state, meta = c.state, c.meta_state
        mx.eval(state)
        return type(c).from_state(state, meta)

    return Engine("mlx-vlm", "mlx_vlm", cache, create_attention_mask, scaled_dot_product_attention, save_load,
                  {"turboquant": "TurboQuantKVCache scripts are not replayed (its codec and attention are "
                                 "compared by conformance.turboquant_mlx_vlm)"})


# vllm-mlx's prefix stores, one engine name each (kvlab_mlx/prefix_stores.py): each name has
# its registers harness/known/<name>-caches and .adapter. kv_quantize at 8 bits, group 64:
# MemoryCacheConfig's defaults.
VLLM_MLX_STORES = {
    "vllm-mlx": ("MemoryAwarePrefixCache", lambda ps: ps.MemoryAwareStore()),
    "vllm-mlx-kvq": ("MemoryAwarePrefixCache kv_quantize", lambda ps: ps.MemoryAwareStore(kv_quantize=(8, 64))),
    "vllm-mlx-manager": ("PrefixCacheManager", lambda ps: ps.ManagerStore()),
    "vllm-mlx-paged": ("BlockAwarePrefixCache over PagedCacheManager", lambda ps: ps.BlockStore()),
}


def _vllm_mlx(name):
    # vllm-mlx's caches are mlx-lm 0.31.3's (its venv, tools/setup_venv_vllm_mlx.sh); what
    # is its own is the prefix store, driven by w, i and g.
    _subpackages("mlx_lm", "mlx-lm", "mlx_lm.models")
    from mlx_lm.models import cache
    from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

    from . import prefix_stores

    _, make = VLLM_MLX_STORES[name]
    return Engine(name, "vllm_mlx", cache, create_attention_mask, scaled_dot_product_attention,
                  _file_round_trip(cache),
                  {"turboquant": "mlx-lm has no TurboQuant cache",
                   "batch_quantized": "mlx-lm has no batched quantized cache"},
                  prefix_store=lambda: make(prefix_stores),
                  only_prefix="vllm-mlx's caches are mlx-lm 0.31.3's, judged by the mlx-lm replay "
                              "(tools/conformance.sh --mlx-lm 0.31.3); its own code replayed here is the prefix store")


# mlx-vlm's automatic prefix caching (kvlab_mlx/prefix_store_apc.py), without and with its
# KV-quantization option (kv_quant_config): registers harness/known/<name>-caches{,.adapter}.
MLX_VLM_STORES = {
    "mlx-vlm-apc": ("APC", lambda m: m.APCStore()),
    "mlx-vlm-apc-kvq": ("APC kv_quant_config", lambda m: m.APCStore(kv_quant=True)),
}


def _mlx_vlm_apc(name):
    # mlx-vlm's cache classes are judged by the mlx-vlm replay; its own code replayed here
    # is the prefix store, with its cache classes (build/venv)
    base = _mlx_vlm()
    from . import prefix_store_apc

    _, make = MLX_VLM_STORES[name]
    base.name = name
    base.prefix_store = lambda: make(prefix_store_apc)
    base.only_prefix = ("mlx-vlm's caches are judged by the mlx-vlm replay (conformance.cache_replay_mlx_vlm); "
                        "its own code replayed here is the prefix store (APC)")
    return base


_LOADERS = {"mlx-lm": _mlx_lm, "mlx-vlm": _mlx_vlm,
            **{name: (lambda n=name: _vllm_mlx(n)) for name in VLLM_MLX_STORES},
            **{name: (lambda n=name: _mlx_vlm_apc(n)) for name in MLX_VLM_STORES}}


def names():
    return sorted(_LOADERS)


def load(name: str) -> Engine:
    if name not in _LOADERS:
        raise ValueError(f"unknown cache engine {name!r} (known: {', '.join(names())})")
    return _LOADERS[name]()
