"""V9 (upstream-bug): once evictions made a row's left padding negative, the roll of a
right pad (in the chunk path while a pad is pending, and in finalize) is added to the
negative value, so the rolled pad stays inside max(0, left_padding) and extract() returns
it as a token. A wrapped ring whose right-padded prefill ends in a one-token chunk."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchRotatingKVCache

c = BatchRotatingKVCache(4, [0])
c.update_and_fetch(mx.ones((1, 1, 6, 1)), mx.ones((1, 1, 6, 1)))       # 6 real tokens: the ring wrapped
c.prepare(right_padding=[1], lengths=[2])                                # next: 2 real tokens, then 1 pad
c.update_and_fetch(mx.full((1, 1, 2, 1), 2.0), mx.full((1, 1, 2, 1), 2.0))
pad = mx.full((1, 1, 1, 1), -7.0)                                        # the one-token last chunk: the pad
c.update_and_fetch(pad, pad)
c.finalize()
row = c.extract(0).keys[0, 0, :, 0].tolist()
print("offset", c.offset.tolist(), "left padding", c.left_padding.tolist(), "extract(0):", row)
assert c.offset.tolist() == [8] and -7.0 in row
