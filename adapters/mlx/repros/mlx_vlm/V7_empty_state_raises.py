"""V7 (upstream-bug): the state of an empty QuantizedKVCache, ChunkedKVCache or
BatchRotatingKVCache raises on keys that are None (KVCache's does not): an unfilled
cache cannot be saved."""
from mlx_vlm.models.cache import BatchRotatingKVCache, ChunkedKVCache, KVCache, QuantizedKVCache

KVCache().state  # fine
for c in (QuantizedKVCache(group_size=32, bits=4), ChunkedKVCache(8), BatchRotatingKVCache(8, [0, 1])):
    try:
        c.state
    except (AttributeError, TypeError) as e:
        print(type(c).__name__, "empty state:", type(e).__name__, e)
    else:
        raise AssertionError(f"{type(c).__name__}: the empty state worked")
