"""Seeded random cache problems for the replay: one case-file line per problem, in kvlab's
cache command language (cache/cache_script.h), for the kinds an engine has.

    python -m kvlab_mlx scripts --count 300 --seed 1 [--engine mlx-vlm] -o random.cases

The same (kinds, count, seed) always gives the same file. Each line names every
parameter it sets and its own fill seed, so a failure's line reruns alone:
`kvlab check --cases <(echo LINE) ...` or `kvlab vectors write --cases`. Lines kvlab
itself refuses (INVALID) are left out by `kvlab vectors write` and counted there.
"""

from __future__ import annotations

import random

KINDS = ("kv", "rotating", "quantized", "chunked", "batch_kv", "batch_rotating")
# The kinds each engine of kvlab_mlx/engines.py has a class for (a kind's scripts do not
# depend on which other kinds are drawn: each kind has its own random stream).
ENGINE_KINDS = {"mlx-lm": KINDS, "mlx-vlm": KINDS + ("batch_quantized",)}
# The kinds a prefix store holds (cache/cache_script.h): the engines with a store replay
# prefix scripts (w, i, g) of these instead.
PREFIX_KINDS = ("kv", "rotating", "quantized")
PREFIX_ENGINES = ("vllm-mlx", "vllm-mlx-kvq", "vllm-mlx-manager", "vllm-mlx-paged", "mlx-vlm-apc", "mlx-vlm-apc-kvq")
# kv_quantize (and APC's kv_quant_config at 8 bits, group 64) groups 64 values along the head dimension, so its kv scripts have D = 64
# (mx.quantize refuses a head dimension that is not a multiple of the group).
_PREFIX_DIMS = {"vllm-mlx-kvq": {"kv": [64]}, "mlx-vlm-apc-kvq": {"kv": [64]}}


def _kind_params(rng: random.Random, kind: str):
    """Shape and kind parameters: small, so hundreds of scripts replay in seconds."""
    batch = kind.startswith("batch_")
    hq, hkv = rng.choice([(4, 2), (2, 1), (4, 4), (6, 2)])
    p = {"kind": kind, "Hq": hq, "Hkv": hkv, "B": rng.randint(2, 4) if batch else rng.randint(1, 2)}
    packed = kind in ("quantized", "batch_quantized")
    p["D"] = 64 if packed else rng.choice([16, 32])
    p["dtype"] = rng.choice(["f32", "f16", "bf16"])
    # RoPE in f16/bf16 differs by arithmetic alone (C1: mx.fast.rope rounds in T), which
    # would claim every failure of such a script; the random scripts explore the caches'
    # bookkeeping, so they rope in f32 only (the tier's cases keep the f16/bf16 ones).
    p["rope"] = 0 if packed or p["dtype"] != "f32" else rng.choice([0, 1])
    if kind in ("kv", "batch_kv") and rng.random() < 0.3:
        p["window"] = rng.randint(2, 12)
    if kind in ("rotating", "batch_rotating"):
        p["max"] = rng.randint(4, 16)
    if kind == "rotating":
        p["keep"] = rng.choice([0, 0, rng.randint(1, min(4, p["max"] - 1))])
    if kind in ("rotating", "batch_rotating") and rng.random() < 0.3:
        p["window"] = rng.randint(2, p["max"])  # a sliding layer narrower than its ring
    if kind == "chunked":
        p["chunk"] = rng.randint(3, 12)
    if packed:
        p["bits"] = rng.choice([2, 3, 4, 5, 6, 8])
        p["group"] = rng.choice([32, 64])
    if batch:
        p["lpad"] = rng.randint(0, 5)
        p["rpad"] = rng.choice([0, rng.randint(1, 3)])
    return p


def _script(rng: random.Random, batch: bool, rows: int, rpad: int):
    """4 to 10 commands. kvlab's rules for right padding (a misuse otherwise): while one is
    pending only decodes, saves, shared steps and the finalize run, and a pending one is
    finalized before the end; a padded chunk is longer than its largest pad."""
    words, attended, pending = [], False, False
    for _ in range(rng.randint(4, 10)):
        if pending:
            choices = ["d", "s", "f", "f"] + (["a"] if attended else [])
        else:
            choices = ["p", "d", "d", "u", "t", "s"] + (["a"] if attended else [])
            if batch:
                choices += ["x", "k"] + (["r", "r"] if rpad else [])
        verb = rng.choice(choices)
        if verb == "p":
            words.append(f"p{rng.randint(2, 20)}")
        elif verb == "d":
            words.append("d")
        elif verb in ("u", "t"):
            words.append(f"{verb}{rng.randint(1, 5)}")
        elif verb in ("s", "a", "f"):
            words.append(verb)
        elif verb == "r":
            words.append(f"r{rng.randint(rpad + 1, 8)}")
            pending = True
        elif verb == "x":
            new = rng.randint(1, 2)
            words.append(f"x{new}p{rng.randint(1, 8)}")
            rows += new
        else:  # k: a non-empty subset of the rows, in a random order
            keep = rng.sample(range(rows), rng.randint(1, rows))
            words.append("k" + "_".join(map(str, keep)))
            rows = len(keep)
        if verb in ("f",):
            pending = False
        attended |= verb in ("p", "d", "r")  # x attends on the new cache, not this one
    if pending:
        words.append("f")
    return ".".join(_merge_decodes(words))


def _merge_decodes(words):
    """kvlab's canonical spelling: consecutive decodes are one dN."""
    out = []
    for w in words:
        if w == "d" and out and (out[-1] == "d" or (out[-1].startswith("d") and out[-1][1:].isdigit())):
            n = 1 if out[-1] == "d" else int(out[-1][1:])
            out[-1] = f"d{n + 1}"
        else:
            out.append(w)
    return out


def _to_quantized(rng: random.Random, p: dict):
    """A quarter of the kv scripts switch to a QuantizedKVCache midway (`q`, mlx-lm's
    KVCache.to_quantized), as generate_step does at quantized_kv_start."""
    words = p["script"].split(".")
    words.insert(rng.randint(0, len(words)), "q")
    p.update({"D": 64, "rope": 0, "bits": rng.choice([2, 3, 4, 5, 6, 8]), "group": rng.choice([32, 64])})
    p["script"] = ".".join(_merge_decodes([w for part in words for w in ([part] if not part.startswith("d") else
                                                                         ["d"] * (int(part[1:]) if part[1:] else 1))]))


def _prefix_script(rng: random.Random):
    """4 to 10 prefix commands over token ids 0..7 (a small alphabet, so requests share
    prefixes with what was stored): w of 1..4 ids, i (always after a w, so the log is not
    empty), g of the written ids cut and extended (or random ids), t, and s right after a w
    (an empty cache's state is mlx-lm 0.31.3's U14, which would end the script there)."""
    words, written = [], []

    def write():
        ids = [rng.randint(0, 7) for _ in range(rng.randint(1, 4))]
        written.extend(ids)
        words.append("w" + "_".join(map(str, ids)))

    for _ in range(rng.randint(4, 10)):
        verb = rng.choice(["w", "w", "i", "g", "g", "t", "s"])
        if verb == "w":
            write()
        elif verb == "i":
            if not words or not words[-1].startswith("w"):
                write()
            words.append("i")
        elif verb == "g":
            ids = [rng.randint(0, 7) for _ in range(rng.randint(1, 4))]
            if written and rng.random() < 0.7:  # most requests near what was stored
                ids = written[:rng.randint(1, len(written))] + ids[:rng.randint(0, 2)]
            words.append("g" + "_".join(map(str, ids)))
        elif verb == "t":
            words.append(f"t{rng.randint(1, 3)}")
        elif words and words[-1].startswith("w"):  # s of a cache that holds tokens
            words.append("s")
    if "i" not in words:
        write()
        words.append("i")
        words.append("g" + "_".join(map(str, written[:3] + [rng.randint(0, 7)])))
    return ".".join(words)


def prefix_lines(count: int, seed: int, kinds=PREFIX_KINDS, engine="vllm-mlx"):
    """Seeded random prefix problems per kind (rope=0: w stores K/V through update alone)."""
    dims = _PREFIX_DIMS.get(engine, {})
    out = []
    for kind in kinds:
        rng = random.Random(f"{seed}:prefix:{kind}")
        for k in range(count):
            hq, hkv = rng.choice([(4, 2), (2, 1), (4, 4)])
            p = {"kind": kind, "Hq": hq, "Hkv": hkv, "B": 1, "D": 64 if kind == "quantized" else rng.choice(dims.get(kind, [16, 32])),
                 "dtype": rng.choice(["f32", "f16", "bf16"]), "rope": 0}
            if kind == "rotating":
                p["max"] = rng.randint(3, 10)
            if kind == "quantized":
                p["bits"], p["group"] = rng.choice([2, 3, 4, 5, 6, 8]), rng.choice([32, 64])
            p["script"] = _prefix_script(rng)
            p["seed"] = k + 1
            out.append("cache " + " ".join(f"{key}={value}" for key, value in p.items()))
    return out


def lines(count: int, seed: int, kinds=KINDS):
    out = []
    for kind in kinds:
        rng = random.Random(f"{seed}:{kind}")
        for k in range(count):
            p = _kind_params(rng, kind)
            p["script"] = _script(rng, kind.startswith("batch_"), p["B"], p.get("rpad", 0))
            if kind == "kv" and rng.random() < 0.25:
                _to_quantized(rng, p)
            p["seed"] = k + 1
            out.append("cache " + " ".join(f"{key}={value}" for key, value in p.items()))
    return out
