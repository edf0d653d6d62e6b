"""V5 (upstream-bug): RotatingKVCache.make_mask for a decode with window_size < max_size
rolls a window over the whole ring as if there were no keep slots: the query sees a sink
token and misses one of its newest neighbours."""
import mlx.core as mx
from mlx_vlm.models.cache import RotatingKVCache

c = RotatingKVCache(max_size=8, keep=2)
x = mx.arange(10, dtype=mx.float32)[None, None, :, None]
c.update_and_fetch(x, x)                                   # tokens 0..9: the ring wrapped
m = c.make_mask(1, window_size=4)
y = mx.full((1, 1, 1, 1), 10.0)
k, _ = c.update_and_fetch(y, y)                            # token 10
ids = k[0, 0, :, 0].tolist()
seen = sorted(int(ids[j]) for j in range(len(ids)) if m[j].item())
print("token 10 with a window of 4 sees", seen, "(the window is 7, 8, 9, 10)")
assert seen != [7, 8, 9, 10] and 0 in seen
