"""The prefix verbs of kvlab's cache language (w, i, g; cache/cache_script.h) through an
engine's own prefix store (vllm-mlx's MemoryAwarePrefixCache, kvlab_mlx/engines.py), for
the cache replay (kvlab_mlx/cache_replay.py). kvlab's PrefixCache is the oracle
(docs/semantics.md §Prefix cache): a hit must hold exactly the K/V and offsets that a
fresh computation of the tokens it reuses would."""

from __future__ import annotations

import mlx.core as mx

from .cache_replay import Setup, _widths, content, engine
from .ops import EngineRaised


class PrefixRun:
    """The prefix verbs through the engine's own store: `w` writes tokens by id (token I's
    K/V is row block I of k and v) through update_and_fetch alone, `i` stores the cache
    under the token log, `g` takes the store's match for a request (clones it, as the
    engine must before replaying into it) or a new cache on a miss; the log becomes the
    tokens the match reused (cache/cache_script.h)."""

    def __init__(self, s: Setup, inputs):
        self.s, self.k, self.v = s, inputs["k"], inputs["v"]
        self.store = engine().prefix_store()
        self.log = []

    def _block(self, flat, ids):
        h = self.s.hkv
        return mx.stack([flat[i * h:(i + 1) * h] for i in ids], axis=1)[None]  # (1, Hkv, n, D)

    def write(self, cache, ids):
        cache.update_and_fetch(self._block(self.k, ids), self._block(self.v, ids))
        self.log += ids

    def insert(self, cache):
        if not self.log:
            raise ValueError("command 'i' inserts a cache that holds no token yet")
        self.store.store(list(self.log), [cache])

    def get(self, ids):
        got, remaining = self.store.fetch(list(ids))
        if got is None:
            self.log = []
            return self.s.new_cache()
        clone = self.store.clone_for_replay(got)
        if clone is None:
            raise ValueError("the engine's store refused to clone its own entry for replay")
        cache, reused = clone[0], len(ids) - len(remaining)
        match = getattr(self.store, "_last_match_type", "?")
        word = "g" + "_".join(map(str, ids))
        if cache.offset != reused:  # the store's answer contradicts itself
            raise EngineRaised(f"{word}: a {match} hit says {reused} tokens are reused, but the "
                               f"{type(cache).__name__} it returns holds {cache.offset}")
        if match == "supersequence" and not remaining:
            # kvlab leaves one token to process (a model needs one for its logits); the
            # engine returns the whole request. Judged here: the K/V must be a fresh
            # computation's, and the script stops, since the logs differ from here on.
            fresh = self.fresh(ids[-min(len(ids), self.s.max_size):] if self.s.kind == "rotating" else ids)
            same = all(mx.array_equal(a, fresh[name]).item() for name, a in content(cache, self.s).items())
            raise EngineRaised(f"{word}: a supersequence hit returns all {reused} requested tokens with nothing "
                               f"left to process (kvlab leaves one); its K/V "
                               f"{'equal' if same else 'DIFFER from'} a fresh computation's")
        self.log = list(ids[:reused])
        return cache

    def fresh(self, ids):
        """The content a cache holding exactly `ids` has, by kvlab's slot names."""
        k, v = self._block(self.k, ids), self._block(self.v, ids)
        if not self.s.packed:
            return {"keys": k.reshape(-1, self.s.dim), "values": v.reshape(-1, self.s.dim)}
        out = {}
        for side, x in (("keys", k), ("values", v)):
            parts = mx.quantize(x, group_size=self.s.group, bits=self.s.bits)
            for (name, (w, _)), part in zip(_widths(self.s).items(), parts):
                out[f"{side}.{name}"] = part.reshape(-1, w)
        return out

    def trimmed(self, n):
        self.log = self.log[:max(0, len(self.log) - n)]
