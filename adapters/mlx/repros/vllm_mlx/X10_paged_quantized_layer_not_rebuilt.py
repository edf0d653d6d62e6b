"""X10 (upstream-bug, a lost hit): a QuantizedKVCache layer's state is a pair of
(codes, scales, biases) tuples with no sequence axis BlockAwarePrefixCache can slice, so
only the block that ends the stored sequence keeps it, whole: a hit on the first blocks
fails reconstruct_cache (the scheduler's miss)."""
import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache
from vllm_mlx.paged_cache import PagedCacheManager
from vllm_mlx.prefix_cache import BlockAwarePrefixCache

store = BlockAwarePrefixCache(object(), PagedCacheManager(block_size=2, max_blocks=64))
c = QuantizedKVCache(group_size=32, bits=4)
k = mx.ones((1, 1, 4, 64))
c.update_and_fetch(k, k)
state = [{"state": c.state, "meta_state": c.meta_state, "class_name": "QuantizedKVCache", "class_ref": type(c)}]
store.store_cache("a", [1, 2, 3, 4], state)
table, remaining = store.fetch_cache("b", [1, 2, 9])
print("blocks shared", len(table.block_ids), "remaining", remaining, "rebuilt", store.reconstruct_cache(table))
assert remaining == [9] and store.reconstruct_cache(table) is None
