"""V10 (upstream-bug): after one in-place step wraps the ring, BatchRotatingKVCache's mask
for a multi-token step anticipates the trim from the cursor (_idx), not the temporal
length: a left-padded row's oldest in-window token is hidden from the chunk's queries,
which attend over max_size - 1 keys where max_size are stored and in the window."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchRotatingKVCache


def put(c, ids):  # one key per token, its value the token's id
    x = mx.array(ids, mx.float32)[:, None, :, None]
    return c.update_and_fetch(x, x)


c = BatchRotatingKVCache(10, [0, 2])                                    # row 1 left-padded by 2
put(c, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 0, 21, 22, 23, 24, 25, 26, 27, 28]])
put(c, [[11], [29]])                                                    # one decode wraps the ring
m = c.make_mask(2)
k, _ = put(c, [[12, 13], [30, 31]])                                     # a 2-token step
ids = k[1, 0, :, 0].tolist()
seen = [int(ids[j]) for j in range(len(ids)) if m[1, 0, 0, j].item()]
print("row 1, query 30 sees", seen, "; 21 is stored:", 21 in ids)
assert 21 in ids and 21 not in seen and len(seen) == 9
