"""A3 (representation): APC pages a QuantizedKVCache (it has dequantize_for_apc, so the
plan is block mode) as float blocks; without kv_quant_config make_warm_kv_cache restores a
float KVCache holding dequantize(stored codes) bit for bit: the layer is no longer
quantized. generate passes kv_quant_config whenever kv_bits made the cache quantized (A5)."""
import mlx.core as mx
from mlx_vlm.apc import APCManager
from mlx_vlm.apc_coordinator import APCCoordinator
from mlx_vlm.models.cache import KVCache, QuantizedKVCache


class Model:
    def __init__(self, make):
        self.make_cache = lambda: [make()]


co = APCCoordinator(APCManager(num_blocks=64, block_size=1), Model(lambda: QuantizedKVCache(group_size=64, bits=4)))
assert co.strategy == "block"
q = QuantizedKVCache(group_size=64, bits=4)
k = mx.random.normal((1, 1, 3, 64), key=mx.random.key(0))
q.update_and_fetch(k, k)
co.commit([q], [1, 2, 3])
hit = co.lookup([1, 2, 3, 4], extra_hash=0, safe_lookup_min=0,
                suffix_is_text_only=lambda n: True, prefix_has_media=lambda n: False)
warm = co.materialize_single(hit, min_capacity_tokens=5, kv_quant_config=None)[0]
print("hit of", hit["prefix_len"], "tokens comes back as", type(warm).__name__)
deq = mx.dequantize(*q.keys, group_size=64, bits=4)[..., :3, :]
assert type(warm) is KVCache and mx.array_equal(warm.keys[..., :3, :], deq).item()
