"""V14 (upstream-bug): kv_bits on a model with sliding-window layers. mlx-vlm's
generate_step quantizes every cache entry whose offset reached quantized_kv_start with
`to_quantized`, and RotatingKVCache.to_quantized raises NotImplementedError: generation
stops at the first step past the start (the golden scenarios kv8 / kv4 of llama_hybrid and
gemma4_small, step 3). The same code as mlx-lm's (mlx-lm issue 1573)."""
import mlx.core as mx
from mlx_vlm.models.cache import RotatingKVCache

ring = RotatingKVCache(max_size=8, keep=0)
ring.update_and_fetch(mx.zeros((1, 1, 16, 32)), mx.zeros((1, 1, 16, 32)))
try:
    ring.to_quantized(group_size=32, bits=8)
except NotImplementedError as e:
    print("RotatingKVCache.to_quantized:", e)
else:
    raise AssertionError("RotatingKVCache.to_quantized worked")
