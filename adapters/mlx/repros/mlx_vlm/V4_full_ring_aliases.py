"""V4 (upstream-bug): once full, RotatingKVCache.update_and_fetch returns its own buffer;
the next in-place update writes into the K/V the caller still holds (a KV-shared layer
that reads its producer's K/V after another update sees the new token)."""
import mlx.core as mx
from mlx_vlm.models.cache import RotatingKVCache

c = RotatingKVCache(max_size=4)
for t in range(4):
    x = mx.full((1, 1, 1, 1), float(t))
    held_k, _ = c.update_and_fetch(x, x)
mx.eval(held_k)
before = held_k[0, 0, :, 0].tolist()
c.update_and_fetch(mx.full((1, 1, 1, 1), 9.0), mx.full((1, 1, 1, 1), 9.0))
after = held_k[0, 0, :, 0].tolist()
print("K held by the caller before / after the next update:", before, after)
assert before == [0, 1, 2, 3] and after != before
