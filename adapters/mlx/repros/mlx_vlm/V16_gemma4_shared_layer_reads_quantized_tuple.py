"""V16 (upstream-bug): Gemma-4 with KV sharing and a quantized cache on a producer layer
(the mlx-swift-lm issue 71 scenario). mlx-vlm's gemma4_text Attention hands the
producer's `update_and_fetch` result to the KV-shared layers; from a QuantizedKVCache
that is a (packed, scales, biases) tuple per K and V, and the shared layer, which has no
cache, calls mx.fast.scaled_dot_product_attention on it: TypeError. mlx-vlm's own batch
path builds exactly this layout with kv_bits (generate/ar.py `_make_cache`: quantized
batch caches for full-attention layers, rings kept; kvlab's policy too). Single-request
generate_step never gets here: the sliding layers raise first (V14)."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchQuantizedKVCache, QuantizedKVCache
from mlx_vlm.models.gemma4_text import Model, ModelConfig

cfg = ModelConfig(hidden_size=64, num_hidden_layers=6, intermediate_size=64, num_attention_heads=2,
                  head_dim=32, global_head_dim=64, num_key_value_heads=1, num_kv_shared_layers=2,
                  vocab_size=256, vocab_size_per_layer_input=256, hidden_size_per_layer_input=16,
                  sliding_window=8, sliding_window_pattern=3)
lm = Model(cfg).language_model
full = cfg.layer_types.index("full_attention")  # layer 2, whose K/V layer 5 reads
for quantized in (QuantizedKVCache(group_size=32, bits=8), BatchQuantizedKVCache([0], group_size=32, bits=8)):
    cache = lm.make_cache()
    cache[full] = quantized
    try:
        mx.eval(lm(mx.array([[1, 2, 3, 4]]), cache=cache).logits)
    except TypeError as e:
        print(type(quantized).__name__, "producer: TypeError:", str(e).splitlines()[0])
    else:
        raise AssertionError(f"{type(quantized).__name__} producer: the KV-shared layers ran")
