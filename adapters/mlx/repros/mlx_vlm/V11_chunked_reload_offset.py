"""V11 (upstream-bug): ChunkedKVCache.state cuts the buffer at the absolute offset, not at
the rows it holds (offset - start_position), and the state setter takes the offset from
the buffer's length. After a front trim and a later update, a reload loses positions."""
import mlx.core as mx
from mlx_vlm.models.cache import ChunkedKVCache


def put(c, n):
    c.maybe_trim_front()                               # llama4's order: trim, then update
    x = mx.ones((1, 1, n, 4))
    c.update_and_fetch(x, x)


c = ChunkedKVCache(6)
put(c, 14)
put(c, 1)                                              # the front trim: start_position 8
c.trim(5)                                              # offset 10, two rows held
c = ChunkedKVCache.from_state(c.state, c.meta_state)
put(c, 1)
put(c, 1)                                              # offset 12
again = ChunkedKVCache.from_state(c.state, c.meta_state)
print("offset before / after the reload:", c.offset, again.offset, "; start_position", again.start_position)
assert c.offset == 12 and again.offset == 10
