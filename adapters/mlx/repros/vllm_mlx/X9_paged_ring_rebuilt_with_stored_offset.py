"""X9 (upstream-bug): BlockAwarePrefixCache.reconstruct_cache rebuilds a RotatingKVCache
layer from block slices of its state with the meta_state of the whole stored entry, so a
hit on the first blocks of an entry comes back with the entry's offset, not the count of
tokens reused (and for a wrapped ring the blocks are ring slots sliced as if they were
token positions)."""
import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache
from vllm_mlx.paged_cache import PagedCacheManager
from vllm_mlx.prefix_cache import BlockAwarePrefixCache

store = BlockAwarePrefixCache(object(), PagedCacheManager(block_size=2, max_blocks=64))
c = RotatingKVCache(max_size=8)
k = mx.arange(4 * 16, dtype=mx.float32).reshape(1, 1, 4, 16)
c.update_and_fetch(k, k)                            # 4 tokens, not wrapped
state = [{"state": c.state, "meta_state": c.meta_state, "class_name": "RotatingKVCache", "class_ref": type(c)}]
store.store_cache("a", [1, 2, 3, 4], state)         # as Scheduler._extract_cache_states gives it
table, remaining = store.fetch_cache("b", [1, 2, 9])
rebuilt = store.reconstruct_cache(table)[0]
print("reused", 3 - len(remaining), "rebuilt offset", rebuilt.offset)
assert 3 - len(remaining) == 2 and rebuilt.offset == 4
