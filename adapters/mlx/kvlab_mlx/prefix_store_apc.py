"""mlx-vlm's automatic prefix caching (APC: mlx_vlm/apc.py, apc_coordinator.py,
apc_adapters.py) behind the prefix replay's store interface (kvlab_mlx/prefix_stores.py),
driven as mlx-vlm's single-stream generation drives it (generate/dispatch.py):

  store (`i`)   APCCoordinator.commit(cache, tokens) in block mode (the layer's K/V cut
                into hashed blocks; a QuantizedKVCache's through dequantize_for_apc), or
                store_checkpoint(tokens, cache) in checkpoint mode (a whole-cache snapshot
                through prefix_cache_snapshot);
  fetch (`g`)   APCCoordinator.lookup(request) (apc_lookup_plan: at most len − 1 tokens,
                so one is left to process), then materialize_single(hit,
                min_capacity_tokens=len + 1, kv_quant_config) and release_hit.

The coordinator's plan comes from a one-layer model whose make_cache gives the script's
cache kind: a KVCache or QuantizedKVCache model runs in block mode, a RotatingKVCache one
in checkpoint mode (apc_adapters.PrefixCachePlan.strategy). Blocks of 1 token (its default
is 16, runtime option apc_block_size; these scripts hold about 20 tokens), checkpoints of
any length (APC_EXACT_MIN_TOKENS=1, not 16) and 64 of them (not 2), no disk tier: each a
configuration mlx-vlm exposes, chosen so its rule can be compared with kvlab's token by
token.

kv_quant: the generation option kv_bits/kv_group_size, which materialize_single receives
as kv_quant_config: None (mlx-vlm-apc), or on (mlx-vlm-apc-kvq): a QuantizedKVCache model
with its own bits and group (the configuration that made its cache quantized), a KVCache
model with 8 bits, group 64. A hit whose layer class or codes differ from what the model
stored is judged here, against the stored entry (K/V by token id: the stored rows of the
reused tokens are a fresh computation's), and stops the script with a finding.
"""

from __future__ import annotations

import copy
import os

import mlx.core as mx

from .ops import EngineRaised

BLOCK_SIZE = 1


def lcp(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def apc_rule(mode, stored, request, block_size=BLOCK_SIZE):
    """Tokens APC's lookup reuses for `request`, from its source: block mode walks the
    chained block hashes of request[:-1] (lookup_prefix), so it reuses the longest run of
    whole blocks that begins a stored sequence's full blocks; checkpoint mode reuses the
    longest stored sequence that is a prefix of the request no longer than len − 1
    (lookup_exact_cache; a non-dense checkpoint is never trimmed). Pure, for the unit test."""
    n = len(request)
    if n < 2:
        return 0
    best = 0
    for e in stored:
        if mode == "block":
            full = len(e) // block_size * block_size
            best = max(best, min(lcp(e, request[:-1]), full) // block_size * block_size)
        elif len(e) <= n - 1 and list(request[:len(e)]) == list(e):
            best = max(best, len(e))
    return best


class _Model:
    def __init__(self, make):
        self.make = make

    def make_cache(self):
        return [self.make()]


def _fresh_like(c):
    from mlx_vlm.models import cache as mc

    if isinstance(c, mc.RotatingKVCache):
        return lambda: mc.RotatingKVCache(max_size=c.max_size, keep=c.keep)
    if isinstance(c, mc.QuantizedKVCache):
        return lambda: mc.QuantizedKVCache(group_size=c.group_size, bits=c.bits)
    return type(c)


class APCStore:
    judge_reuse = True  # its rule is its own (apc_rule): every hit is compared with kvlab's
    quantizes = None  # a quantized hit is judged here (fetch), not by the replay
    block_size = BLOCK_SIZE

    def __init__(self, kv_quant=False):
        os.environ["APC_EXACT_MIN_TOKENS"] = "1"  # read by APCManager.__init__
        from mlx_vlm.apc import APCManager

        self.kv_quant = kv_quant
        self.manager = APCManager(num_blocks=4096, block_size=self.block_size, disk=None,
                                  overrides={"checkpoint_entries": 64})
        self.coordinator = None
        self.stored = []  # (tokens, a copy of the cache stored)
        self.layer = None

    def _coordinate(self, cache):
        if self.coordinator is None:
            from mlx_vlm.apc_coordinator import APCCoordinator

            self.coordinator = APCCoordinator(self.manager, _Model(_fresh_like(cache)))
            if not self.coordinator.enabled:
                raise EngineRaised(f"APC refuses a {type(cache).__name__} model (no restorable plan)")
        return self.coordinator

    @property
    def mode(self):
        return "checkpoint" if self.coordinator is not None and self.coordinator.is_checkpoint else "block"

    def _quant_config(self):
        if not self.kv_quant or self.layer is None:
            return None
        if type(self.layer).__name__ == "QuantizedKVCache":
            return {"bits": self.layer.bits, "group_size": self.layer.group_size}
        return {"bits": 8, "group_size": 64}

    def store(self, tokens, cache):
        co = self._coordinate(cache)
        self.layer = cache
        if co.is_checkpoint:
            co.store_checkpoint(list(tokens), [cache])
        else:
            co.commit([cache], list(tokens))
        self.stored.append((list(tokens), copy.deepcopy(cache)))

    def fetch(self, tokens):
        if self.coordinator is None:  # nothing stored yet
            return None, 0, "miss"
        co = self.coordinator
        hit = co.lookup(list(tokens), extra_hash=0, safe_lookup_min=0,
                        suffix_is_text_only=lambda n: True, prefix_has_media=lambda n: False)
        if hit is None:
            return None, 0, "miss"
        try:
            warm = co.materialize_single(hit, min_capacity_tokens=len(tokens) + 1,
                                         kv_quant_config=self._quant_config())
        finally:
            co.release_hit(hit)
        reused = hit["prefix_len"]
        if not warm:
            return None, 0, f"miss (materialize_single gave no cache for a {reused}-token {self.mode} hit)"
        got = warm[0]
        self._judge_layer(tokens, got, reused)
        return got, reused, f"{self.mode}"

    def own_rule(self, tokens):
        return apc_rule(self.mode, [t for t, _ in self.stored], list(tokens), self.block_size)

    def keys(self):
        return [t for t, _ in self.stored]

    # ---- a hit whose layer is not what the model stored --------------------------------

    def _source(self, ids):
        """The stored copy whose tokens begin with `ids` (the hit's provenance)."""
        for t, c in reversed(self.stored):
            if t[:len(ids)] == list(ids):
                return c
        return None

    def _judge_layer(self, tokens, got, reused):
        src = self._source(tokens[:reused])
        if src is None:
            return  # the replay's provenance check names it
        was, now = type(src).__name__, type(got).__name__
        if was == now and was != "QuantizedKVCache":
            return
        word = "g" + "_".join(map(str, tokens))
        if was == "QuantizedKVCache":
            g, b = src.group_size, src.bits
            codes = [tuple(p[..., :reused, :] for p in part) for part in (src.keys, src.values)]
            fresh = [mx.dequantize(*c, group_size=g, bits=b) for c in codes]
            if now == "KVCache":
                same = all(mx.array_equal(f, x[..., :reused, :]).item() for f, x in zip(fresh, (got.keys, got.values)))
                raise EngineRaised(
                    f"{word}: a {reused}-token block hit on a QuantizedKVCache ({b} bits, group {g}) returns a float "
                    f"KVCache {'equal to' if same else 'that DIFFERS from'} dequantize(stored codes): the layer is no "
                    f"longer quantized (kv_quant_config None)")
            if now == "QuantizedKVCache":
                mine = [tuple(p[..., :reused, :] for p in part) for part in (got.keys, got.values)]
                same = all(mx.array_equal(x, y).item() for c, m in zip(codes, mine) for x, y in zip(c, m))
                if same:
                    return
                back = [mx.dequantize(*m, group_size=got.group_size, bits=got.bits) for m in mine]
                steps = max(mx.max(mx.abs(x - f) / mx.maximum(mx.repeat(mx.abs(c[1]), g, axis=-1), 1e-30)).item()
                            for x, f, c in zip(back, fresh, codes))
                raise EngineRaised(
                    f"{word}: a {reused}-token block hit on a QuantizedKVCache ({b} bits, group {g}) returns codes "
                    f"that DIFFER from the stored (fresh) ones: requantized from their dequantization; its "
                    f"dequantized K/V are up to {steps:.2f} steps of the fresh scale off the fresh ones")
        if was == "KVCache" and now == "QuantizedKVCache":
            keys, values = src.keys[..., :reused, :], src.values[..., :reused, :]
            want = [mx.quantize(x, group_size=got.group_size, bits=got.bits) for x in (keys, values)]
            mine = [tuple(p[..., :reused, :] for p in part) for part in (got.keys, got.values)]
            same = all(mx.array_equal(x, y).item() for w, m in zip(want, mine) for x, y in zip(w, m))
            raise EngineRaised(
                f"{word}: kv_quant_config turns a {reused}-token block hit on a KVCache into a QuantizedKVCache "
                f"({got.bits} bits, group {got.group_size}) {'equal to' if same else 'that DIFFERS from'} "
                f"quantize(fresh K/V)")
        raise EngineRaised(f"{word}: a {reused}-token {self.mode} hit on a {was} returns a {now}")
