"""X8 (representation): with kv_quantize on, MemoryAwarePrefixCache stores a plain KVCache
as mx.quantize codes (kv_bits 8, group 64 by default) and a hit returns their
dequantization: exactly dequantize(quantize(K/V)) of a fresh computation, not the K/V
themselves (kvlab's PrefixCache stores K/V exactly)."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

store = MemoryAwarePrefixCache(object(), MemoryCacheConfig(max_memory_mb=64, min_prefix_tokens=1, kv_quantize=True,
                                                           kv_min_quantize_tokens=1))
k = mx.random.normal((1, 2, 5, 64), key=mx.random.key(0)).astype(mx.float16)
c = KVCache()
c.update_and_fetch(k, k)
store.store([1, 2, 3, 4, 5], [c])
got, remaining = store.fetch([1, 2, 3, 9])          # an LCP hit: 3 tokens reused
keys = got[0].state[0]
want = mx.dequantize(*mx.quantize(k[..., :3, :], group_size=64, bits=8), group_size=64, bits=8)
print("match", store._last_match_type, "offset", got[0].offset, "max |hit - fresh|",
      mx.max(mx.abs(keys - k[..., :3, :])).item())
assert got[0].offset == 3 and mx.array_equal(keys, want).item()
assert not mx.array_equal(keys, k[..., :3, :]).item()
