"""A2 (representation, a lost hit by design): in checkpoint mode (a RotatingKVCache model)
APC reuses a stored snapshot only when it is a prefix of the request: a stored [1 2 3 4]
on a ring of 8 that has not wrapped (trimmable) serves neither [1 2 9] (lcp) nor [1 2]
(a proper prefix), where kvlab's PrefixCache trims it and reuses 2 and 1 tokens."""
import os

os.environ["APC_EXACT_MIN_TOKENS"] = "1"
import mlx.core as mx
from mlx_vlm.apc import APCManager
from mlx_vlm.apc_coordinator import APCCoordinator
from mlx_vlm.models.cache import RotatingKVCache


class Model:
    def __init__(self, make):
        self.make_cache = lambda: [make()]


def lookup(co, request):
    return co.lookup(request, extra_hash=0, safe_lookup_min=0,
                     suffix_is_text_only=lambda n: True, prefix_has_media=lambda n: False)


co = APCCoordinator(APCManager(num_blocks=64, block_size=1), Model(lambda: RotatingKVCache(max_size=8)))
r = RotatingKVCache(max_size=8)
k = mx.arange(4 * 16, dtype=mx.float32).reshape(1, 1, 4, 16)
r.update_and_fetch(k, k)
assert r.is_trimmable() and co.store_checkpoint([1, 2, 3, 4], [r])
print("lcp:", lookup(co, [1, 2, 9]), "prefix of the stored:", lookup(co, [1, 2]))
assert lookup(co, [1, 2, 9]) is None and lookup(co, [1, 2]) is None
