"""A5 (upstream-bug): APC stores a QuantizedKVCache layer as dequantize_for_apc floats and,
with kv_quant_config (as generate passes it when kv_bits is set), re-quantizes them on
restore. MLX's affine quantize is not idempotent (the scale is re-derived from the
dequantized group's edge), so the hit's codes differ from the ones the model computed and
stored: its dequantized K/V are off a fresh computation's by up to about 2 quantization
steps (3 to 8 bits; 2 bits round-trips), against apc.py's docstring ("The K/V tensors
stored in the block pool are byte-identical to what a fresh prefill would produce")."""
import mlx.core as mx
from mlx_vlm.apc import APCManager
from mlx_vlm.apc_coordinator import APCCoordinator
from mlx_vlm.models.cache import QuantizedKVCache


class Model:
    def __init__(self, make):
        self.make_cache = lambda: [make()]


bits, group = 4, 64
co = APCCoordinator(APCManager(num_blocks=64, block_size=1), Model(lambda: QuantizedKVCache(group, bits)))
q = QuantizedKVCache(group_size=group, bits=bits)
k = mx.random.normal((1, 1, 3, 64), key=mx.random.key(2))
q.update_and_fetch(k, k)
co.commit([q], [1, 2, 3])
hit = co.lookup([1, 2, 3, 4], extra_hash=0, safe_lookup_min=0,
                suffix_is_text_only=lambda n: True, prefix_has_media=lambda n: False)
warm = co.materialize_single(hit, min_capacity_tokens=5, kv_quant_config={"bits": bits, "group_size": group})[0]
fresh = [p[..., :3, :] for p in q.keys]
got = [p[..., :3, :] for p in warm.keys]
err = mx.max(mx.abs(mx.dequantize(*got, group_size=group, bits=bits) - mx.dequantize(*fresh, group_size=group, bits=bits)))
print(type(warm).__name__, "codes equal:", [mx.array_equal(a, b).item() for a, b in zip(got, fresh)],
      "max |dequantized difference|", err.item(), "fresh scale", mx.max(mx.abs(fresh[1])).item())
assert not mx.array_equal(got[0], fresh[0]).item() and err.item() > 0
