"""V8 (upstream-bug): BatchRotatingKVCache.meta_state writes rotated as the string
"False", and the setter reads bool("False"), which is True: a reloaded ring in temporal
order says it has wrapped, so extract() cuts the row at max_size from the oldest column
and loses the newest tokens."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchRotatingKVCache


def put(c, ids):
    x = mx.array(ids, mx.float32)[None, None, :, None]
    c.update_and_fetch(x, x)


c = BatchRotatingKVCache(4, [0])
put(c, [0, 1, 2])
put(c, [3, 4, 5])                    # a chunk: 6 columns in temporal order, never wrapped in place
again = BatchRotatingKVCache.from_state(c.state, c.meta_state)
before, after = c.extract(0).keys[0, 0, :, 0].tolist(), again.extract(0).keys[0, 0, :, 0].tolist()
print("meta_state", c.meta_state, "rotated", c.rotated, "->", again.rotated, "; extract(0)", before, "->", after)
assert c.rotated is False and again.rotated is True and 5.0 in before and 5.0 not in after
