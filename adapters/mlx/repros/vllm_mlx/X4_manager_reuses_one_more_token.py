"""X4 (representation): vllm-mlx's PrefixCacheManager reuses one token more than kvlab's
PrefixCache in two places, with K/V that equal a fresh computation's: (a) a longer entry
is trimmed to the whole request, nothing left to process (kvlab leaves one, as X1);
(b) a stored prefix stays stored after a longer trimmable entry is stored, and serves
its own request exactly (kvlab's insertion rule drops it; the longer entry then serves
the request with one token left)."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.prefix_cache import PrefixCacheManager

k = mx.arange(3 * 16, dtype=mx.float32).reshape(1, 1, 3, 16)


def cache_of(n):
    c = KVCache()
    c.update_and_fetch(k[..., :n, :], k[..., :n, :])
    return c


store = PrefixCacheManager(object())
store.store_cache([1, 2, 3], [cache_of(3)])
got, remaining = store.fetch_cache([1, 2])          # (a) a supersequence of the request
print("(a) supersequence: reused", got[0].offset, "remaining", remaining)
assert got[0].offset == 2 and remaining == []
assert mx.array_equal(got[0].state[0], k[..., :2, :]).item()

store = PrefixCacheManager(object())
store.store_cache([1, 2], [cache_of(2)])
store.store_cache([1, 2, 3], [cache_of(3)])         # kvlab drops [1, 2] here
got, remaining = store.fetch_cache([1, 2])          # (b) still an exact hit
print("(b) exact on a kept prefix: reused", got[0].offset, "remaining", remaining, "entries", len(store))
assert len(store) == 2 and got[0].offset == 2 and remaining == []
assert mx.array_equal(got[0].state[0], k[..., :2, :]).item()
