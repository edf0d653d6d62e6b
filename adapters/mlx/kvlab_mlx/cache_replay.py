"""kvlab's cache command language replayed through an engine's own cache classes (mlx-lm's
by default, or another engine of kvlab_mlx/engines.py).

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

import mlx.core as mx

from . import engines
from .ops import EngineRaised, Unsupported
from .problem import Problem

# The engine whose cache classes the replay drives (kvlab_mlx/engines.py); `run
# --cache-engine NAME` chooses it before the first problem.
ENGINE = None


def use_engine(name: str):
    global ENGINE
    ENGINE = engines.load(name)


def engine():
    if ENGINE is None:
        use_engine("mlx-lm")
    return ENGINE


# ---- the script -----------------------------------------------------------------------

_COMMAND = re.compile(r"^(p|d|u|t|r|x)(\d+)?(?:p(\d+))?$|^(a|s|f|q|j|i)$|^([kwg])(\d+(?:_\d+)*)$")
_PREFIX_VERBS = ("w", "i", "g")


# Commands of kvlab's language this replay does not drive, with the reason.
_NOT_REPLAYED = {
    "m": "the quantization policy (mN) is not replayed yet",
    "e": "the ring snapshot (e) is not replayed yet",
    "c": "the chunked front trim (c) is not replayed yet",
}


def parse_script(text: str):
    """[(verb, n, rows, ids)] from kvlab's canonical script word (ids: the rows k keeps, the
    tokens w writes and g requests)."""
    out = []
    for word in text.split("."):
        if word[:1] in _NOT_REPLAYED and not _COMMAND.match(word):
            raise Unsupported(f"command {word!r}: {_NOT_REPLAYED[word[:1]]}")
        m = _COMMAND.match(word)
        if not m:
            raise ValueError(f"script {text!r}: {word!r} is not a command")
        if m.group(4):
            out.append((m.group(4), 0, 0, None))
        elif m.group(5):  # k, w, g: a list of row indices or token ids
            out.append((m.group(5), 0, 0, [int(i) for i in m.group(6).split("_")]))
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
# device_batch_kv is kvlab's BatchKVCache with offsets kept on the device: the same
# semantics, so mlx-lm's BatchKVCache is its counterpart too.
_BATCH = ("batch_kv", "batch_rotating", "device_batch_kv", "batch_quantized")


_CLASSES = {"kv": "KVCache", "rotating": "RotatingKVCache", "quantized": "QuantizedKVCache",
            "chunked": "ChunkedKVCache", "batch_kv": "BatchKVCache", "device_batch_kv": "BatchKVCache",
            "batch_rotating": "BatchRotatingKVCache", "batch_quantized": "BatchQuantizedKVCache"}


def spread(pad: int, rows: int):
    """kvlab's padding rule (cache_script.h): row b gets floor(pad·b/(rows−1)), pad when rows = 1."""
    return [pad] if rows == 1 else [pad * b // (rows - 1) for b in range(rows)]


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
        self.lpad, self.rpad = p.int("lpad", 0), p.int("rpad", 0)
        eng = engine()
        prefix = any(w[:1] in _PREFIX_VERBS for w in p.word("script").split("."))
        if prefix and eng.prefix_store is None:
            raise Unsupported(f"prefix scripts (w, i, g): {eng.name} has no prefix store the replay drives "
                              "(vllm-mlx's is: --cache-engine vllm-mlx)")
        if eng.only_prefix and not prefix:
            raise Unsupported(eng.only_prefix)
        if self.kind in eng.not_driven:
            raise Unsupported(f"kind={self.kind}: {eng.not_driven[self.kind]}")
        if self.kind not in _SINGLE + _BATCH:
            raise Unsupported(f"kind={self.kind}: no {eng.name} counterpart known to the replay")
        self.is_batch = self.kind in _BATCH
        cls = _CLASSES[self.kind]
        if not hasattr(eng.cache, cls):  # an older release (tools/conformance.sh --mlx-lm)
            raise Unsupported(f"kind={self.kind}: this {eng.name} has no {cls}")
        self.packed = self.kind in ("quantized", "batch_quantized")
        quantizes = self.packed or "q" in p.word("script").split(".")
        if quantizes and self.qmode != "affine":
            raise Unsupported(f"qmode={self.qmode}: {eng.name}'s QuantizedKVCache is affine only")
        self.scale = 1.0 / math.sqrt(self.dim)

    def new_cache(self, rows=None):
        if self.kind == "batch_rotating":
            return engine().cache.BatchRotatingKVCache(self.max_size, spread(self.lpad, rows))
        if self.kind == "batch_quantized":
            return engine().cache.BatchQuantizedKVCache(spread(self.lpad, rows), group_size=self.group, bits=self.bits)
        if self.is_batch:
            return engine().cache.BatchKVCache(spread(self.lpad, rows))
        if self.kind == "kv":
            return engine().cache.KVCache()
        if self.kind == "rotating":
            return engine().cache.RotatingKVCache(max_size=self.max_size, keep=self.keep)
        if self.kind == "quantized":
            return engine().cache.QuantizedKVCache(group_size=self.group, bits=self.bits)
        return engine().cache.ChunkedKVCache(self.chunk)

    def roped(self, x, offset):
        if not self.rope:
            return x
        return mx.fast.rope(x, self.dim, traditional=False, base=10000.0, scale=1.0, offset=offset)


# ---- observables ----------------------------------------------------------------------

def offsets(cache):
    """Per-row offsets: the batch caches' offset array, a single cache's int."""
    return cache.offset.tolist() if isinstance(cache.offset, mx.array) else [cache.offset]


def kv_length(cache) -> int:
    """Key rows the cache holds for attention: size() where the class defines it."""
    if isinstance(cache, engine().cache.ChunkedKVCache):
        return cache.offset - cache.start_position
    if isinstance(cache, engine().cache.QuantizedKVCache):
        return cache.offset
    if type(cache).__name__ == "BatchQuantizedKVCache":  # no size(): the cursor, as BatchKVCache.size()
        return cache._idx
    return cache.size()


def _live(cache, buf):
    """The stored rows of one buffer (or packed part) in temporal order, (B, H, L, W)."""
    if isinstance(cache, engine().cache.RotatingKVCache):
        return cache._temporal_order(buf)
    if isinstance(cache, engine().cache.ChunkedKVCache):
        return buf[..., : cache.offset - cache.start_position, :]
    return buf[..., : cache.offset, :]


def _newest(rows, setup: Setup):
    """A row extract()ed from a batch cache: its real tokens in temporal order. After a
    multi-token step BatchRotatingKVCache.extract() still holds that step's max_size+S−1
    tokens, of which a later step reads at most the newest max_size (C4 in
    adapters/mlx/DIVERGENCES.md); kvlab's content is those, so the replay compares them."""
    if setup.kind == "batch_rotating" and rows.shape[2] > setup.max_size:
        return rows[:, :, -setup.max_size:, :]
    return rows


def _widths(setup: Setup):
    """The packed parts of an affine quantized K or V row: (width, dtype) by kvlab's slot name."""
    d = setup.dim
    return {"wq": (d * setup.bits // 32, mx.uint32), "scales": (d // setup.group, setup.dtype),
            "biases": (d // setup.group, setup.dtype)}


def content(cache, setup: Setup):
    """Each component as (rows, W) in (row, head, temporal) order; (0, W) when empty."""
    def rows(buf, w, dtype):
        return mx.zeros((0, w), dtype) if buf is None else _live(cache, buf).reshape(-1, w)

    def joined(parts, w, dtype):
        return mx.concatenate(parts) if parts else mx.zeros((0, w), dtype)

    d = setup.dim
    if setup.is_batch:
        # Each row through the engine's own extract(): its real tokens, padding dropped.
        rows_of = [cache.extract(b) for b in range(len(offsets(cache)))] if cache.keys is not None else []
        out = {}
        for side in ("keys", "values"):
            if setup.packed:  # each row a QuantizedKVCache: its (wq, scales, biases) parts
                for i, (name, (w, dtype)) in enumerate(_widths(setup).items()):
                    parts = [getattr(c, side)[i].reshape(-1, w) for c in rows_of if getattr(c, side) is not None]
                    out[f"{side}.{name}"] = joined(parts, w, dtype)
            else:
                out[side] = joined([_newest(getattr(c, side), setup).reshape(-1, d) for c in rows_of], d, setup.dtype)
        return out
    if isinstance(cache, engine().cache.QuantizedKVCache):  # kind quantized, or kv after `q`
        out = {}
        for side, parts in (("keys", cache.keys), ("values", cache.values)):
            for i, (name, (w, dtype)) in enumerate(_widths(setup).items()):
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
    if isinstance(cache, engine().cache.ChunkedKVCache):
        if s.window:
            raise Unsupported(f"window={s.window} on a chunked cache: llama4's chunked layers have no window")
        end = cache.offset + n
        keys = mx.arange(cache.start_position, end)
        queries = mx.arange(cache.offset, end)[:, None]
        return (keys // s.chunk == queries // s.chunk) & (keys <= queries)
    return engine().create_attention_mask(mx.zeros((s.batch, n, 1)), cache, window_size=s.window or None)


def _zero_unseeing_rows(out, mask):
    """Query rows that mlx-lm's own mask leaves without a visible key (left-padding
    queries of a batch) have no defined output: mlx-lm's attention averages V there and
    the model discards them. kvlab's contract writes 0 (FullyMaskedRow::zero), so those
    rows, and only those, are written as 0: a mask that wrongly showed a padding key would
    leave its row visible and compared."""
    if mask is None or isinstance(mask, str) or mask.dtype != mx.bool_:
        return out
    sees = mx.any(mask, axis=-1, keepdims=True)  # (..., N, 1) broadcast over heads and D
    return mx.where(sees, out, mx.zeros_like(out))


def _engine_frame(tb):
    """The innermost traceback frame of the engine's own code, or None: the error is the
    adapter's (MLX's C++ errors surface in the engine frame that called the op)."""
    found = None
    # the engine's package, and the one its cache classes come from (vllm-mlx: mlx_lm)
    packages = {engine().package, engine().cache.__name__.split(".")[0]}
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.split(".")[0] in packages:
            found = tb
        tb = tb.tb_next
    return found


def replay(p: Problem, inputs):
    try:
        return _replay(p, inputs)
    except (Unsupported, EngineRaised):
        raise
    except Exception as e:
        frame = _engine_frame(e.__traceback__)
        if frame is None:
            raise
        code = frame.tb_frame.f_code
        where = f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.tb_lineno})"
        raise EngineRaised(f"{type(e).__name__}: {e} in {where}") from e


def _replay(p: Problem, inputs):
    s = Setup(p)
    script = parse_script(p.word("script"))
    q, k, v = (_Rows(inputs[name]) for name in ("q", "k", "v"))
    rows = s.batch
    cache = s.new_cache(rows)
    outs, offs, lengths = [], [], []
    prefix = None
    if any(verb in _PREFIX_VERBS for verb, *_ in script):
        from .prefix_replay import PrefixRun  # it uses this module's content()

        prefix = PrefixRun(s, inputs, p.line)
    producer = None  # (roped-at offsets, fetched K, V, mask, rows, tokens) of the last attention

    def observe():
        offs.extend(offsets(cache))
        lengths.append(kv_length(cache))

    def attend(target, b, n):
        """One model-layer step on `target` for b rows of n new tokens; a step of the main
        cache becomes the producer a shared step (`a`) reads."""
        nonlocal producer
        if isinstance(target, engine().cache.ChunkedKVCache):
            target.maybe_trim_front()  # llama4's order, as kvlab's chunked kind
        qs = q.take(b, s.hq, n, s.dim)
        ks, vs = k.take(b, s.hkv, n, s.dim), v.take(b, s.hkv, n, s.dim)
        offset = target.offset
        mask = _mask(target, s, n)
        qr, kr = s.roped(qs, offset), s.roped(ks, offset)
        fk, fv = target.update_and_fetch(kr, vs)
        out = engine().sdpa(qr, fk, fv, cache=target, scale=s.scale, mask=mask)
        outs.append(_zero_unseeing_rows(out, mask))
        if target is cache:
            producer = (offset, fk, fv, mask, b, n, target)

    for verb, n, new_rows, ids in script:
        if verb in ("p", "d"):
            for _ in range(n if verb == "d" else 1):
                attend(cache, rows, n if verb == "p" else 1)
                observe()
        elif verb == "u":
            if isinstance(cache, engine().cache.ChunkedKVCache):
                cache.maybe_trim_front()
            cache.update_and_fetch(k.take(rows, s.hkv, n, s.dim), v.take(rows, s.hkv, n, s.dim))
            observe()
        elif verb == "t":
            if cache.is_trimmable():
                trimmed = cache.trim(n)
                if prefix is not None:
                    prefix.trimmed(trimmed)
            observe()
        elif verb == "w":
            prefix.write(cache, ids)
            observe()
        elif verb == "i":
            prefix.insert(cache)
            observe()
        elif verb == "g":
            cache = prefix.get(ids)
            observe()
        elif verb == "a":
            if producer is None:
                raise ValueError("`a` before any attention")
            offset, fk, fv, mask, b, tokens, source = producer  # the producer's cache decides quantized or not
            qs = s.roped(q.take(b, s.hq, tokens, s.dim), offset)
            out = engine().sdpa(qs, fk, fv, cache=source, scale=s.scale, mask=mask)
            outs.append(_zero_unseeing_rows(out, mask))
            observe()
        elif verb == "s":
            cache = engine().save_load(cache)
            observe()
        elif verb == "q":  # generate_step's maybe_quantize_kv_cache at quantized_kv_start
            cache = cache.to_quantized(group_size=s.group, bits=s.bits)
            observe()
        elif not s.is_batch:
            raise ValueError(f"command {verb!r} is a batch command; kind={s.kind} is a single-sequence cache")
        elif verb == "r":
            # BatchGenerator's right-padded chunk: prepare(), then the step; row b's last
            # spread(rpad) tokens are padding.
            right = spread(s.rpad, rows)
            if isinstance(cache, engine().cache.BatchRotatingKVCache):
                cache.prepare(right_padding=right, lengths=[n - r for r in right])
            else:
                cache.prepare(right_padding=right)
            attend(cache, rows, n)
            observe()
        elif verb == "f":
            cache.finalize()
            observe()
        elif verb == "k":
            cache.filter(mx.array(ids))
            rows = len(ids)
            observe()
        elif verb == "x":
            other = s.new_cache(new_rows)
            attend(other, new_rows, n)
            cache.extend(other)
            rows += new_rows
            observe()
        elif verb == "j":  # every row extracted, then the class's merge (BatchGenerator's)
            if not hasattr(type(cache), "merge"):
                raise Unsupported(f"command 'j': {engine().name}'s {type(cache).__name__} has no merge")
            cache = type(cache).merge([cache.extract(i) for i in range(rows)])
            observe()

    result = {
        "attn": mx.concatenate([o.reshape(-1, s.dim) for o in outs]) if outs else mx.zeros((0, s.dim), s.dtype),
        "offsets": mx.array(offs, dtype=mx.int32),
        "kv_length": mx.array(lengths, dtype=mx.int32),
    }
    for name, content_rows in content(cache, s).items():
        result[name] = content_rows
    return result
