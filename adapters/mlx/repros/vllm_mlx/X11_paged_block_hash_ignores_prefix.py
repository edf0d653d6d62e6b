"""X11 (upstream-bug, a wrong answer for a real model): PagedCacheManager.find_cached_block
hashes a block's own tokens, not the prefix before it (the chained compute_block_hash in
the same module is not used on this path), so BlockAwarePrefixCache serves a request's
first block [1, 2] with the K/V stored for tokens 1, 2 at positions 2, 3 of [9, 9, 1, 2]:
K/V computed after another prefix (another RoPE position and attention context)."""
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from vllm_mlx.paged_cache import PagedCacheManager
from vllm_mlx.prefix_cache import BlockAwarePrefixCache

store = BlockAwarePrefixCache(object(), PagedCacheManager(block_size=2, max_blocks=64))
c = KVCache()
k = mx.arange(4 * 16, dtype=mx.float32).reshape(1, 1, 4, 16)
c.update_and_fetch(k, k)
state = [{"state": c.state, "meta_state": c.meta_state, "class_name": "KVCache", "class_ref": type(c)}]
store.store_cache("a", [9, 9, 1, 2], state)
table, remaining = store.fetch_cache("b", [1, 2, 5])   # no stored sequence begins with [1, 2]
rebuilt = store.reconstruct_cache(table)[0]
print("reused", 3 - len(remaining), "rows served: positions 2, 3 of the stored [9, 9, 1, 2]")
assert remaining == [5] and mx.array_equal(rebuilt.state[0], k[..., 2:4, :]).item()
