"""A1 (representation): mlx-vlm's APC always leaves one token of a request to process
(apc_lookup_plan accepts 0 < prefix_len < n; block mode looks up request[:-1]): a request
equal to a stored sequence reuses n - 1 tokens in block mode (a KVCache model) and misses
in checkpoint mode (a RotatingKVCache model), where kvlab's PrefixCache reuses all n. The
K/V it returns equal the stored (fresh) ones."""
import os

os.environ["APC_EXACT_MIN_TOKENS"] = "1"  # checkpoints of any length (default 16)
import mlx.core as mx
from mlx_vlm.apc import APCManager
from mlx_vlm.apc_coordinator import APCCoordinator
from mlx_vlm.models.cache import KVCache, RotatingKVCache


class Model:  # one attention layer
    def __init__(self, make):
        self.make_cache = lambda: [make()]


def lookup(co, request):
    return co.lookup(request, extra_hash=0, safe_lookup_min=0,
                     suffix_is_text_only=lambda n: True, prefix_has_media=lambda n: False)


tokens = [1, 2, 3, 4]
k = mx.arange(4 * 16, dtype=mx.float32).reshape(1, 1, 4, 16)

co = APCCoordinator(APCManager(num_blocks=64, block_size=1), Model(KVCache))
c = KVCache()
c.update_and_fetch(k, k)
co.commit([c], tokens)
hit = lookup(co, tokens)
warm = co.materialize_single(hit, min_capacity_tokens=5)[0]
print("block mode: reused", hit["prefix_len"], "of", len(tokens))
assert hit["prefix_len"] == 3 and warm.offset == 3 and mx.array_equal(warm.keys[..., :3, :], k[..., :3, :]).item()

co = APCCoordinator(APCManager(num_blocks=64, block_size=1), Model(lambda: RotatingKVCache(max_size=8)))
assert co.is_checkpoint
r = RotatingKVCache(max_size=8)
r.update_and_fetch(k, k)
assert co.store_checkpoint(tokens, [r])
print("checkpoint mode:", lookup(co, tokens))
assert lookup(co, tokens) is None and lookup(co, tokens + [5])["prefix_len"] == 4
