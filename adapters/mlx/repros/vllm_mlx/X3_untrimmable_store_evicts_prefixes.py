"""X3 (upstream-bug, a lost hit): storing an entry evicts every stored proper prefix of it,
even when the new entry is a wrapped RotatingKVCache that cannot be trimmed back to serve
them; a later request that branches after the prefix then misses."""
import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache
from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig


def ring(n):
    c = RotatingKVCache(max_size=4)
    for t in range(n):
        x = mx.full((1, 1, 1, 1), float(t))
        c.update_and_fetch(x, x)
    return c


store = MemoryAwarePrefixCache(object(), MemoryCacheConfig(max_memory_mb=64, min_prefix_tokens=1))
store.store([1, 2], [ring(2)])
print("[1, 2] then serves [1, 2, 7]:", store.fetch([1, 2, 7])[1])
store.store([1, 2, 3, 4, 5], [ring(5)])           # wrapped: is_trimmable() is False
got, remaining = store.fetch([1, 2, 7])
print("after storing a wrapped [1..5]:", store._last_match_type, remaining)
assert got is None and store._last_match_type.startswith("miss")
