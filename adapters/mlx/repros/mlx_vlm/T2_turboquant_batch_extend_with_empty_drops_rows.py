"""T2 (upstream-bug): BatchTurboQuantKVCache.extend, when exactly one side holds no token
yet (keys None: a batch made, not prefilled), takes the other side's storage as the
whole batch's: offset and left_padding gain the empty side's rows, the packed state does
not. The batch then has more rows than its storage, and the next update_and_fetch raises
(broadcast_shapes). Both directions. mlx-lm fixed the same case in BatchKVCache.extend
(PR 1141); mlx-vlm PR 1110's test covers only both sides empty."""
import mlx.core as mx
from mlx_vlm.turboquant import BatchTurboQuantKVCache

for empty_side in ("other", "self"):
    full = BatchTurboQuantKVCache([1, 0], bits=4, seed=0)
    k = mx.random.normal((2, 1, 4, 64), key=mx.random.key(0))
    full.update_and_fetch(k, k)
    empty = BatchTurboQuantKVCache([0], bits=4, seed=0)
    cache = full if empty_side == "other" else empty
    cache.extend(empty if empty_side == "other" else full)
    rows = cache.left_padding.shape[0]
    stored = cache.state[0].norms.shape[0]
    print(f"empty {empty_side}: {rows} rows (offset {cache.offset.tolist()}), {stored} stored")
    assert (rows, stored) == (3, 2)
    step = mx.random.normal((3, 1, 1, 64), key=mx.random.key(1))
    try:
        cache.update_and_fetch(step, step)
    except ValueError as e:
        print("  the next decode step:", e)
        assert "broadcast_shapes" in str(e)
    else:
        raise AssertionError("the decode step after extend went through")
