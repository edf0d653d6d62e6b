"""kvlab's cache command language replayed through mlx-lm's own cache classes.

A `cache` problem of a kvlab vectors file carries its script (harness/ops/cache_script.h)
and the flat inputs q (rows, D), k and v (rows, D). This module runs the script as an
mlx-lm model layer drives its cache — RoPE at `cache.offset`, `update_and_fetch`, the
cache's `make_mask` through `create_attention_mask`, and mlx-lm's
`scaled_dot_product_attention` (the quantized one for a QuantizedKVCache) — and returns
kvlab's observables under kvlab's slot names:

  attn       every attention output, step after step, as (rows, D)
  offsets    the offsets after every command (each decode of dN counts)
  kv_length  the key rows the cache holds for attention after every command
  content    the final logical content: "keys"/"values", or the packed parts
             "keys.wq", "keys.scales", "keys.biases", then the values'

kvlab then judges them with the cache op's own policy (`kvlab check --vectors`). Where
mlx-lm has no counterpart (a kind, a quantization mode, a command) the problem raises
Unsupported with the reason, so nothing is compared silently against a stand-in.
"""

from __future__ import annotations

import math
import os
import re
import tempfile

import mlx.core as mx
from mlx_lm.models import cache as lm_cache
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

from .ops import Unsupported
from .problem import Problem


# ---- the script -----------------------------------------------------------------------

_COMMAND = re.compile(r"^(p|d|u|t|r|x)(\d+)?(?:p(\d+))?$|^(a|s|f)$|^k(\d+(?:_\d+)*)$")


def parse_script(text: str):
    """[(verb, n, rows, keep)] from kvlab's canonical script word."""
    out = []
    for word in text.split("."):
        m = _COMMAND.match(word)
        if not m:
            raise ValueError(f"script {text!r}: {word!r} is not a command")
        if m.group(4):
            out.append((m.group(4), 0, 0, None))
        elif m.group(5):
            out.append(("k", 0, 0, [int(i) for i in m.group(5).split("_")]))
        else:
            verb, n = m.group(1), int(m.group(2) or 1)
            if verb == "x":
                if m.group(3) is None:
                    raise ValueError(f"script {text!r}: {word!r} needs xRpN")
                out.append(("x", int(m.group(3)), n, None))
            else:
                out.append((verb, n, 0, None))
    return out


# ---- the setup ------------------------------------------------------------------------

_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
_SINGLE = ("kv", "rotating", "quantized", "chunked")


class Setup:
    def __init__(self, p: Problem):
        self.kind = p.word("kind")
        self.batch = p.int("B", 1)
        self.hq, self.hkv, self.dim = p.int("Hq", 4), p.int("Hkv", 2), p.int("D", 64)
        self.dtype = _DTYPES[p.word("dtype", "f32")]
        self.rope = p.flag("rope", 1)
        self.window = p.int("window", 0)
        self.max_size, self.keep, self.chunk = p.int("max", 16), p.int("keep", 0), p.int("chunk", 16)
        self.qmode, self.bits, self.group = p.word("qmode", "affine"), p.int("bits", 4), p.int("group", 32)
        if self.kind not in _SINGLE:
            raise Unsupported(f"kind={self.kind}: the replay covers the single-sequence kinds {', '.join(_SINGLE)} "
                              "so far (batch kinds: not yet; turboquant: no mlx-lm class)")
        if self.kind == "quantized" and self.qmode != "affine":
            raise Unsupported(f"qmode={self.qmode}: mlx-lm 0.32.2's QuantizedKVCache is affine only")
        self.scale = 1.0 / math.sqrt(self.dim)

    def new_cache(self):
        if self.kind == "kv":
            return lm_cache.KVCache()
        if self.kind == "rotating":
            return lm_cache.RotatingKVCache(max_size=self.max_size, keep=self.keep)
        if self.kind == "quantized":
            return lm_cache.QuantizedKVCache(group_size=self.group, bits=self.bits)
        return lm_cache.ChunkedKVCache(self.chunk)

    def roped(self, x, offset):
        if not self.rope:
            return x
        return mx.fast.rope(x, self.dim, traditional=False, base=10000.0, scale=1.0, offset=offset)


# ---- observables ----------------------------------------------------------------------

def kv_length(cache) -> int:
    """Key rows the cache holds for attention: size() where the class defines it."""
    if isinstance(cache, lm_cache.ChunkedKVCache):
        return cache.offset - cache.start_position
    if isinstance(cache, lm_cache.QuantizedKVCache):
        return cache.offset
    return cache.size()


def _live(cache, buf):
    """The stored rows of one buffer (or packed part) in temporal order, (B, H, L, W)."""
    if isinstance(cache, lm_cache.RotatingKVCache):
        return cache._temporal_order(buf)
    if isinstance(cache, lm_cache.ChunkedKVCache):
        return buf[..., : cache.offset - cache.start_position, :]
    return buf[..., : cache.offset, :]


def content(cache, setup: Setup):
    """Each component as (rows, W) in (row, head, temporal) order; (0, W) when empty."""
    def rows(buf, w, dtype):
        return mx.zeros((0, w), dtype) if buf is None else _live(cache, buf).reshape(-1, w)

    d = setup.dim
    if setup.kind == "quantized":
        widths = {"wq": (d * setup.bits // 32, mx.uint32), "scales": (d // setup.group, setup.dtype),
                  "biases": (d // setup.group, setup.dtype)}
        out = {}
        for side, parts in (("keys", cache.keys), ("values", cache.values)):
            for i, (name, (w, dtype)) in enumerate(widths.items()):
                out[f"{side}.{name}"] = rows(None if parts is None else parts[i], w, dtype)
        return out
    return {"keys": rows(cache.keys, d, setup.dtype), "values": rows(cache.values, d, setup.dtype)}


# ---- running --------------------------------------------------------------------------

class _Rows:
    """Consumes the flat (rows, D) inputs in the plan's order."""

    def __init__(self, flat):
        self.flat, self.next = flat, 0

    def take(self, b, h, n, d):
        rows = b * h * n
        if self.next + rows > self.flat.shape[0]:
            raise ValueError(f"the script needs more than the {self.flat.shape[0]} input rows")
        block = self.flat[self.next:self.next + rows].reshape(b, h, n, d)
        self.next += rows
        return block


def _mask(cache, s: Setup, n: int):
    """The mask an mlx-lm model builds for n new tokens: the cache's make_mask through
    create_attention_mask; for a ChunkedKVCache (which has none) llama4's own chunk mask
    (llama4.py LanguageModel: keys [start, offset + n) against queries [offset, offset + n),
    same chunk and causal)."""
    if isinstance(cache, lm_cache.ChunkedKVCache):
        if s.window:
            raise Unsupported(f"window={s.window} on a chunked cache: llama4's chunked layers have no window")
        end = cache.offset + n
        keys = mx.arange(cache.start_position, end)
        queries = mx.arange(cache.offset, end)[:, None]
        return (keys // s.chunk == queries // s.chunk) & (keys <= queries)
    return create_attention_mask(mx.zeros((s.batch, n, 1)), cache, window_size=s.window or None)


def replay(p: Problem, inputs):
    s = Setup(p)
    script = parse_script(p.word("script"))
    q, k, v = (_Rows(inputs[name]) for name in ("q", "k", "v"))
    cache = s.new_cache()
    outs, offsets, lengths = [], [], []
    producer = None  # (roped-at offset, fetched K, V, mask, tokens) of the last attention

    def observe():
        offsets.append(cache.offset)
        lengths.append(kv_length(cache))

    def attend(n):
        nonlocal producer
        if isinstance(cache, lm_cache.ChunkedKVCache):
            cache.maybe_trim_front()  # llama4's order, as kvlab's chunked kind
        qs = q.take(s.batch, s.hq, n, s.dim)
        ks, vs = k.take(s.batch, s.hkv, n, s.dim), v.take(s.batch, s.hkv, n, s.dim)
        offset = cache.offset
        mask = _mask(cache, s, n)
        qr, kr = s.roped(qs, offset), s.roped(ks, offset)
        fk, fv = cache.update_and_fetch(kr, vs)
        outs.append(scaled_dot_product_attention(qr, fk, fv, cache=cache, scale=s.scale, mask=mask))
        producer = (offset, fk, fv, mask, n)

    for verb, n, _rows, _keep in script:
        if verb in ("p", "d"):
            for _ in range(n if verb == "d" else 1):
                attend(n if verb == "p" else 1)
                observe()
        elif verb == "u":
            if isinstance(cache, lm_cache.ChunkedKVCache):
                cache.maybe_trim_front()
            cache.update_and_fetch(k.take(s.batch, s.hkv, n, s.dim), v.take(s.batch, s.hkv, n, s.dim))
            observe()
        elif verb == "t":
            if cache.is_trimmable():
                cache.trim(n)
            observe()
        elif verb == "a":
            if producer is None:
                raise ValueError("`a` before any attention")
            offset, fk, fv, mask, tokens = producer
            qs = s.roped(q.take(s.batch, s.hq, tokens, s.dim), offset)
            outs.append(scaled_dot_product_attention(qs, fk, fv, cache=cache, scale=s.scale, mask=mask))
            observe()
        elif verb == "s":
            cache = _save_load(cache)
            observe()
        else:
            raise Unsupported(f"command {verb!r}: a batch command, not replayed for kind={s.kind}")

    result = {
        "attn": mx.concatenate([o.reshape(-1, s.dim) for o in outs]) if outs else mx.zeros((0, s.dim), s.dtype),
        "offsets": mx.array(offsets, dtype=mx.int32),
        "kv_length": mx.array(lengths, dtype=mx.int32),
    }
    for name, rows in content(cache, s).items():
        result[name] = rows
    return result


def _save_load(cache):
    """mlx-lm's own prompt-cache file round trip: save_prompt_cache, load_prompt_cache."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cache.safetensors")
        lm_cache.save_prompt_cache(path, [cache])
        return lm_cache.load_prompt_cache(path)[0]
