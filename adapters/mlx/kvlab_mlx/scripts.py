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
