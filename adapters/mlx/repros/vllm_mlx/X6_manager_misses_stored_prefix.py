"""X6 (upstream-bug, a lost hit): vllm-mlx's PrefixCacheManager._search walks the trie down
the request and checks for a cached node only where the walk stops, so a stored prefix
of the request passed on the way is missed: with [1, 2] and [1, 2, 3, 4] stored, the
request [1, 2, 3, 9] misses although [1, 2] is a stored prefix of it (its docstring:
"Shorter match: Partial prefix found, process remaining tokens")."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.prefix_cache import PrefixCacheManager


def cache_of(n):
    c = KVCache()
    k = mx.ones((1, 1, n, 16))
    c.update_and_fetch(k, k)
    return c


store = PrefixCacheManager(object())
store.store_cache([1, 2], [cache_of(2)])
store.store_cache([1, 2, 3, 4], [cache_of(4)])
got, remaining = store.fetch_cache([1, 2, 3, 9])
print("cache", got, "remaining", remaining)
assert got is None and remaining == [1, 2, 3, 9]
got, remaining = store.fetch_cache([1, 2, 9])       # the walk stops at [1, 2]: found
assert got is not None and remaining == [9]
