"""X1 (representation): a supersequence hit of MemoryAwarePrefixCache comes back trimmed
to the whole request, with nothing left to process; kvlab leaves one token, since a model
needs one to produce logits. The K/V returned are the request's own (a fresh
computation's), and vllm-mlx's scheduler drops such a hit and prefills instead."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

store = MemoryAwarePrefixCache(object(), MemoryCacheConfig(max_memory_mb=64, min_prefix_tokens=1))
c = KVCache()
k = mx.arange(3, dtype=mx.float32).reshape(1, 1, 3, 1)
c.update_and_fetch(k, k)
store.store([1, 2, 3], [c])
got, remaining = store.fetch([1, 2])
print("match", store._last_match_type, "offset", got[0].offset, "remaining", remaining,
      "keys", got[0].keys[0, 0, :got[0].offset, 0].tolist())
assert store._last_match_type == "supersequence" and got[0].offset == 2 and remaining == []
