"""A4 (representation): with kv_quant_config (generate's kv_bits, kv_group_size) a block
hit on a KVCache model is rebuilt as a QuantizedKVCache (should_quantize_kv_layer: every
layer of a model of at most 2): its codes equal quantize(fresh K/V) bit for bit, where
kvlab's oracle stores K/V exactly."""
import mlx.core as mx
from mlx_vlm.apc import APCManager
from mlx_vlm.apc_coordinator import APCCoordinator
from mlx_vlm.models.cache import KVCache, QuantizedKVCache


class Model:
    def __init__(self, make):
        self.make_cache = lambda: [make()]


co = APCCoordinator(APCManager(num_blocks=64, block_size=1), Model(KVCache))
c = KVCache()
k = mx.random.normal((1, 1, 3, 64), key=mx.random.key(1))
c.update_and_fetch(k, k)
co.commit([c], [1, 2, 3])
hit = co.lookup([1, 2, 3, 4], extra_hash=0, safe_lookup_min=0,
                suffix_is_text_only=lambda n: True, prefix_has_media=lambda n: False)
warm = co.materialize_single(hit, min_capacity_tokens=5, kv_quant_config={"bits": 8, "group_size": 64})[0]
print("hit of", hit["prefix_len"], "tokens comes back as", type(warm).__name__)
want = mx.quantize(k, group_size=64, bits=8)
assert type(warm) is QuantizedKVCache
assert all(mx.array_equal(a[..., :3, :], b).item() for a, b in zip(warm.keys, want))
