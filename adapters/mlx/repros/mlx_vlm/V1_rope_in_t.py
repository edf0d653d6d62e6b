"""V1 (representation): mx.fast.rope in f16 rounds cos/sin, both products and the sum to
f16; a once-rounded rotation differs by about an ulp of the larger product. mlx-vlm's
layers rope with it, so the keys its caches store inherit the difference."""
import mlx.core as mx
import numpy as np

x = mx.array(np.random.default_rng(1).standard_normal((1, 1, 2, 64)).astype(np.float16))
y = np.array(mx.fast.rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=1).astype(mx.float32))[0, 0, 1]
xf = np.array(x.astype(mx.float32), dtype=np.float64)[0, 0, 1]
angle = 2.0 * 10000.0 ** (-np.arange(32) / 32)  # position 2 (offset 1, second row)
once = np.concatenate([xf[:32] * np.cos(angle) - xf[32:] * np.sin(angle),
                       xf[:32] * np.sin(angle) + xf[32:] * np.cos(angle)]).astype(np.float16)
gap = np.abs(y - once.astype(np.float32)).max()
print("max |f16 rope - once-rounded|:", gap)
assert 0 < gap < 4e-3, gap
