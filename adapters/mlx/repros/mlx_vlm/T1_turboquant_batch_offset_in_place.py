"""T1 (upstream-bug): BatchTurboQuantKVCache.update_and_fetch advances `offset` with `+=`
and trim takes it back with `-=`, which MLX applies to the array object itself. `state`
returns that same object, so a state taken earlier (a prompt-cache save, a state round
trip) no longer reads the offsets it was taken with once the cache goes on; the codes it
holds do not move. The same mechanism as V2 (mlx-lm #1806, fixed there by PR 1848)."""
import mlx.core as mx
from mlx_vlm.turboquant import BatchTurboQuantKVCache

cache = BatchTurboQuantKVCache([2, 0], bits=4, seed=0)
k = mx.random.normal((2, 1, 5, 64), key=mx.random.key(0))
cache.update_and_fetch(k, k)
held = cache.state                            # (keys, values, offset, left_padding)
taken = held[2].tolist()                      # [3, 5]: each row's real tokens
step = mx.random.normal((2, 1, 1, 64), key=mx.random.key(1))
cache.update_and_fetch(step, step)
print("offset in a state taken before a decode step:", taken, "-> now", held[2].tolist())
assert held[2].tolist() == [t + 1 for t in taken]
held = cache.state
taken = held[2].tolist()
cache.trim(1)
print("offset in a state taken before trim(1):", taken, "-> now", held[2].tolist())
assert held[2].tolist() == [t - 1 for t in taken]
