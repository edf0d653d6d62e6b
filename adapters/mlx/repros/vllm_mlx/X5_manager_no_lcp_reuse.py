"""X5 (representation): vllm-mlx's PrefixCacheManager has no longest-common-prefix path:
an entry that diverges from the request is never trimmed to serve it (its docstring
names exact, shorter and longer matches only). kvlab's PrefixCache, like vllm-mlx's
MemoryAwarePrefixCache, trims the trimmable entry to the common prefix."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.prefix_cache import PrefixCacheManager

c = KVCache()
k = mx.ones((1, 1, 3, 16))
c.update_and_fetch(k, k)
store = PrefixCacheManager(object())
store.store_cache([1, 2, 3], [c])
got, remaining = store.fetch_cache([1, 2, 9])       # shares [1, 2] with a trimmable entry
print("cache", got, "remaining", remaining)
assert got is None and remaining == [1, 2, 9]
