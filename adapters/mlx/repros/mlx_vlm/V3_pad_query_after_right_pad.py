"""V3 (representation): a token stepped after a right-padded chunk and before finalize()
lies beyond the lengths prepare() declared, so finalize() rolls it to the front as a pad
(the offsets drop by one in every row). Its query is a pad query. mlx-vlm builds that
step's mask before the update rolls the row's written pads to the front, so the query
sees them; kvlab's mask anticipates the roll. Neither output is defined by a contract."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchRotatingKVCache

c = BatchRotatingKVCache(8, [0, 0])
c.prepare(right_padding=[0, 2], lengths=[6, 4])   # row 1: 4 tokens, then 2 pads
k = mx.zeros((2, 1, 6, 4))
c.update_and_fetch(k, k)
mask = c.make_mask(1)                              # the step's mask, before its update
c.update_and_fetch(k[:, :, :1], k[:, :, :1])       # the concat path rolls row 1's pads to the front
print("row 1's left padding after the roll:", c.left_padding.tolist()[1], "; its query sees columns",
      [j for j in range(mask.shape[-1]) if mask[1, 0, 0, j].item()])
assert mask[1, 0, 0, 0].item() and c.left_padding.tolist()[1] == 2   # column 0 is a pad now, and visible
c.finalize()
print("offsets after finalize:", c.offset.tolist(), "(the stepped token is rolled away as a pad)")
assert c.offset.tolist() == [6, 4]
