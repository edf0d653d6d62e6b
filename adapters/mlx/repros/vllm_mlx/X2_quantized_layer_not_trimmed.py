"""X2 (upstream-bug): _trim_cache_offset skips an mlx-lm QuantizedKVCache layer (its keys
are a tuple), so an LCP (or supersequence) hit says n tokens are reused while the cache it
returns still holds the whole entry: the tokens processed next follow stale ones."""
import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache
from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

store = MemoryAwarePrefixCache(object(), MemoryCacheConfig(max_memory_mb=64, min_prefix_tokens=1))
c = QuantizedKVCache(group_size=32, bits=4)
k = mx.ones((1, 1, 3, 64))
c.update_and_fetch(k, k)
store.store([1, 2, 3], [c])
got, remaining = store.fetch([1, 2, 9])            # shares [1, 2] with the entry
reused = 3 - len(remaining)
print("match", store._last_match_type, "reused", reused, "but the cache holds", got[0].offset)
assert store._last_match_type == "lcp" and reused == 2 and got[0].offset == 3
