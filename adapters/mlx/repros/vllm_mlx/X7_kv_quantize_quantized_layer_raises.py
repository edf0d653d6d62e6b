"""X7 (upstream-bug, a crash): with kv_quantize on, MemoryAwarePrefixCache.fetch copies a
layer it did not quantize through _dequantize_cache, which calls mx.array(layer.keys);
an mlx-lm QuantizedKVCache layer's keys are a (codes, scales, biases) tuple of different
shapes, so every hit on it raises ValueError out of fetch."""
import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache
from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

store = MemoryAwarePrefixCache(object(), MemoryCacheConfig(max_memory_mb=64, min_prefix_tokens=1, kv_quantize=True,
                                                           kv_min_quantize_tokens=1))
c = QuantizedKVCache(group_size=32, bits=4)
k = mx.ones((1, 1, 3, 64))
c.update_and_fetch(k, k)
store.store([1, 2, 3], [c])
try:
    store.fetch([1, 2, 3])                          # an exact hit
    raise AssertionError("fetch returned: X7 no longer reproduces")
except ValueError as e:
    print("fetch raised ValueError:", e)
    assert "non-uniform" in str(e)
