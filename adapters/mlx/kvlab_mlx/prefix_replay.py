"""The prefix verbs of kvlab's cache language (w, i, g; cache/cache_script.h) through an
engine's own prefix store (one of vllm-mlx's, kvlab_mlx/prefix_stores.py, chosen by the
engine name in kvlab_mlx/engines.py), for the cache replay (kvlab_mlx/cache_replay.py).
kvlab's PrefixCache is the oracle (docs/semantics.md §Prefix cache): a hit must hold
exactly the K/V and offsets that a fresh computation of the tokens it reuses would.

With KVLAB_PREFIX_HITS=FILE each request appends one JSON line to FILE: the problem line
and the kind of hit kvlab's rule gives it (exact, prefix, supersequence, lcp, miss), and
whether the live cache was trimmed before it (tools/cache_replay_table.py --hits)."""

from __future__ import annotations

import json
import os

import mlx.core as mx

from .cache_replay import Setup, _widths, content, engine
from .ops import EngineRaised
from .prefix_stores import KvlabPolicy


class PrefixRun:
    """The prefix verbs through the engine's own store: `w` writes tokens by id (token I's
    K/V is row block I of k and v) through update_and_fetch alone, `i` stores the cache
    under the token log, `g` takes the store's match for a request (clones it, as the
    engine must before replaying into it) or a new cache on a miss; the log becomes the
    tokens the match reused (cache/cache_script.h)."""

    def __init__(self, s: Setup, inputs, line: str = ""):
        self.s, self.k, self.v, self.line = s, inputs["k"], inputs["v"], line
        self.store = engine().prefix_store()
        self.kvlab = KvlabPolicy()  # what kvlab's store holds, by keys
        self.log = []
        self.was_trimmed = False
        self.inserted = []  # every token log stored, for the provenance of a hit

    def _block(self, flat, ids):
        h = self.s.hkv
        return mx.stack([flat[i * h:(i + 1) * h] for i in ids], axis=1)[None]  # (1, Hkv, n, D)

    def write(self, cache, ids):
        cache.update_and_fetch(self._block(self.k, ids), self._block(self.v, ids))
        self.log += ids

    def insert(self, cache):
        if not self.log:
            raise ValueError("command 'i' inserts a cache that holds no token yet")
        self.store.store(list(self.log), cache)
        self.kvlab.insert(self.log, cache.is_trimmable())
        self.inserted.append(list(self.log))

    def _note_hit(self, kind):
        path = os.environ.get("KVLAB_PREFIX_HITS")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"line": self.line, "hit": kind, "after_trim": self.was_trimmed}) + "\n")

    def get(self, ids):
        want, kvlab_kind = self.kvlab.fetch(ids)
        self._note_hit(kvlab_kind)
        cache, reused, match = self.store.fetch(list(ids))
        word = "g" + "_".join(map(str, ids))
        if cache is not None and cache.offset != reused:  # the store's answer contradicts itself
            raise EngineRaised(f"{word}: a {match} hit says {reused} tokens are reused, but the "
                               f"{type(cache).__name__} it returns holds {cache.offset}")
        if self.store.judge_reuse and reused and not any(log[:reused] == list(ids[:reused]) for log in self.inserted):
            # K/V by id cannot show it, but a model's K/V of a token depend on every token
            # before it: tokens that never began a stored sequence have no stored K/V a
            # fresh computation would give
            raise EngineRaised(f"{word}: the store's {match} answer reuses {reused} tokens that begin no stored "
                               f"sequence (stored: {' '.join('_'.join(map(str, x)) for x in self.inserted)}): "
                               f"K/V computed under another prefix")
        if self.store.judge_reuse and reused != want:
            self._judge_other_reuse(word, ids, cache, reused, match, want, kvlab_kind)
        if self.store.judge_reuse and cache is not None and not self._same_as_fresh(cache, ids[:reused]):
            raise EngineRaised(f"{word}: the store's {match} hit of {reused} tokens (kvlab's {kvlab_kind} answer "
                               f"reuses as many) returns a {type(cache).__name__} whose K/V DIFFER from a fresh "
                               f"computation's")
        if cache is None:
            self.log = []
            return self.s.new_cache()
        remaining = ids[reused:]
        if self.store.quantizes and type(cache).__name__ == "KVCache":
            self._judge_quantized_hit(word, ids[:reused], cache, match, len(remaining))
        if match == "supersequence" and not remaining:
            # kvlab leaves one token to process (a model needs one for its logits); the
            # engine returns the whole request. Judged here: the K/V must be a fresh
            # computation's, and the script stops, since the logs differ from here on.
            same = self._same_as_fresh(cache, ids)
            raise EngineRaised(f"{word}: a supersequence hit returns all {reused} requested tokens with nothing "
                               f"left to process (kvlab leaves one); its K/V "
                               f"{'equal' if same else 'DIFFER from'} a fresh computation's")
        self.log = list(ids[:reused])
        return cache

    def _same_as_fresh(self, cache, ids):
        """Whether the rows the cache holds are a fresh computation's newest ones of `ids`
        (all of them, but for a ring: after a multi-token write mlx-lm's ring holds up to
        max_size + n − 1 rows, kvlab's too)."""
        if cache is None or not ids:
            return True
        got = content(cache, self.s)
        held = next(iter(got.values())).shape[0] // self.s.hkv
        if held > len(ids) or (self.s.kind != "rotating" and held != len(ids)):
            return False
        fresh = self.fresh(ids[len(ids) - held:])
        return all(mx.array_equal(a, fresh[name]).item() for name, a in got.items())

    def _judge_other_reuse(self, word, ids, cache, reused, match, want, kvlab_kind):
        """The store reuses another count of tokens than kvlab's rule: judge the K/V it
        returns against a fresh computation, then stop the script (the logs differ from
        here on) with a finding that names both answers. The engine's own stored keys say
        whether a stored prefix of the request was there to serve it."""
        same = self._same_as_fresh(cache, ids[:reused])
        held = max((len(k) for k in self.store.keys() if len(k) < len(ids) and list(ids[:len(k)]) == k), default=0)
        why = (f"; its own store holds a {held}-token prefix of the request" if held > reused else "")
        own = getattr(self.store, "own_rule", None)
        if own is not None:  # a store with a rule of its own (blocks): say whether it kept it
            rule = own(ids)
            why = "; as its block rule gives" if rule == reused else f"; its block rule gives {rule}"
        raise EngineRaised(f"{word}: the store's {match} answer reuses {reused} tokens where kvlab's {kvlab_kind} "
                           f"answer reuses {want}{why}; its K/V {'equal' if same else 'DIFFER from'} a fresh computation's")

    def _judge_quantized_hit(self, word, ids, cache, match, left):
        """kv_quantize keeps a plain KVCache entry as mx.quantize codes and returns their
        dequantization: the hit must equal dequantize(quantize(fresh K/V)) bit for bit
        (groups run along the head dimension, so a token's codes do not depend on the other
        tokens stored). The bound it implies (docs/quantization.md §Affine parameters): at
        most |scale| per element (half a step, but the far extreme of a group can cost a
        whole one), plus what rounding to the dtype T adds (u its unit roundoff, n = 2^bits
        − 1 the largest code): n·u·|scale| from the scale stored in T, as much again from
        the product code·scale rounded in T, and u·|x̂| (≤ 2u·|x| here) from the sum. Judged here, then the script stops: kvlab's oracle
        stores K/V exactly."""
        bits, group = self.store.quantizes
        fresh, got = self.fresh(ids), content(cache, self.s)
        u = {mx.float32: 2.0 ** -24, mx.float16: 2.0 ** -11, mx.bfloat16: 2.0 ** -8}[self.s.dtype]
        same, worst = True, 0.0
        for name in ("keys", "values"):
            x = fresh[name]
            wq, scales, biases = mx.quantize(x, group_size=group, bits=bits)
            expected = mx.dequantize(wq, scales, biases, group_size=group, bits=bits)
            same = same and mx.array_equal(got[name], expected).item()
            bound = mx.repeat(mx.abs(scales.astype(mx.float32)), group, axis=-1) * (1 + 2 * (2 ** bits - 1) * u)
            err = mx.abs(got[name].astype(mx.float32) - x.astype(mx.float32))
            bound = bound + 2 * u * mx.abs(x.astype(mx.float32))
            worst = max(worst, mx.max(err / mx.maximum(bound, 1e-30)).item())
        raise EngineRaised(f"{word}: a kv_quantize {match} hit of {len(ids)} tokens ({left} left to process) returns "
                           f"K/V {'equal to' if same else 'that DIFFER from'} dequantize(quantize(fresh)) at {bits} bits, "
                           f"group {group}; worst error {worst:.3f} of the derived bound "
                           f"({'within' if worst <= 1 else 'BEYOND'} it)")

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
        self.was_trimmed = self.was_trimmed or n > 0
