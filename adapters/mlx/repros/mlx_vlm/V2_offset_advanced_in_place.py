"""V2 (upstream-bug): BatchKVCache.update_and_fetch advances `offset` with `+=`, which
MLX applies to the array object itself: an offset taken before the update (what a
KV-shared layer ropes its queries at) changes under its holder. mlx-lm 0.32.2 rebinds
(mlx-lm#1806, PR #1848); mlx-vlm's gemma4/gemma3n copy it (mx.array(cache.offset))."""
import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache

for cache in (BatchKVCache([0, 1]), BatchRotatingKVCache(8, [0, 1])):
    held = cache.offset                      # the producer's positions, taken before the update
    before = held.tolist()
    k = mx.zeros((2, 1, 3, 4))
    cache.update_and_fetch(k, k)
    print(type(cache).__name__, "offset taken before the update:", before, "-> now", held.tolist())
    assert held.tolist() == [b + 3 for b in before]
