"""V6 (upstream-bug): from_state builds with __new__ and sets only state/meta_state, so a
batch cache reloaded while a right pad is pending has no _right_padding (BatchKVCache,
BatchQuantizedKVCache) or _lengths (BatchRotatingKVCache): the next finalize raises."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchQuantizedKVCache, BatchRotatingKVCache

k = mx.zeros((2, 1, 4, 64))
for c in (BatchKVCache([0, 0]), BatchQuantizedKVCache([0, 0], group_size=32, bits=4), BatchRotatingKVCache(8, [0, 0])):
    c.prepare(right_padding=[0, 1], lengths=[4, 3])
    c.update_and_fetch(k, k)
    again = type(c).from_state(c.state, c.meta_state)
    try:
        again.finalize()
    except AttributeError as e:
        print(type(c).__name__, "reloaded:", e)
    else:
        raise AssertionError(f"{type(c).__name__}: finalize after from_state worked")
