"""X12 (representation): BlockAwarePrefixCache shares whole blocks only: a stored
sequence's trailing partial block is never reused and a diverging entry is never trimmed,
so with blocks of 2 a request [1, 2, 3, 4] after storing [1, 2, 3] reuses 2 tokens where
kvlab's PrefixCache reuses 3. The K/V it does return equal a fresh computation's."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.paged_cache import PagedCacheManager
from vllm_mlx.prefix_cache import BlockAwarePrefixCache

store = BlockAwarePrefixCache(object(), PagedCacheManager(block_size=2, max_blocks=64))
c = KVCache()
k = mx.arange(3 * 16, dtype=mx.float32).reshape(1, 1, 3, 16)
c.update_and_fetch(k, k)
state = [{"state": c.state, "meta_state": c.meta_state, "class_name": "KVCache", "class_ref": type(c)}]
store.store_cache("a", [1, 2, 3], state)
table, remaining = store.fetch_cache("b", [1, 2, 3, 4])
rebuilt = store.reconstruct_cache(table)[0]
print("reused", 4 - len(remaining), "of the 3 stored")
assert remaining == [3, 4] and rebuilt.offset == 2 and mx.array_equal(rebuilt.state[0], k[..., :2, :]).item()
