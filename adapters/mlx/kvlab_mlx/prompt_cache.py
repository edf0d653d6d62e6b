"""Prompt-cache files both ways between mlx-lm and kvlab (`python -m kvlab_mlx prompt-cache`).

For every case of prompt_cache_cases.json: build an mlx-lm cache with seeded K/V, save it
with save_prompt_cache, and
  1. convert it with `kvlab cache convert` to kvlab's format and back to mlx-lm's, load
     that kvlab-written file with load_prompt_cache, continue it and the original with
     the same new K/V, and compare what update_and_fetch returns and the offsets, bit
     for bit;
  2. continue it with kvlab's own caches (`kvlab cache continue`, the same new K/V) and
     compare the resulting state with mlx-lm's own continuation (saved, converted to
     kvlab's format by kvlab): every tensor bit for bit and every meta value;
  3. load that kvlab continuation, written by kvlab in mlx-lm's format, with
     load_prompt_cache and continue it beside mlx-lm's own continuation, bit for bit.
Exit status 0 when every case is bit-exact, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as mlx_cache

CASES = Path(__file__).with_name("prompt_cache_cases.json")
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def _bits(a: mx.array) -> np.ndarray:
    """The array's bytes as unsigned integers, so NaNs and -0.0 compare exactly."""
    if a.dtype in (mx.float16, mx.bfloat16):
        a = a.view(mx.uint16)
    elif a.dtype == mx.float32:
        a = a.view(mx.uint32)
    return np.array(a)


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, mx.array) and isinstance(b, mx.array):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(_bits(a), _bits(b))
    return a == b


class _Source:
    """Seeded K/V blocks; a case draws the same blocks for every copy it continues."""

    def __init__(self, case: dict, seed: int):
        self.rng = np.random.default_rng(seed)
        self.B, self.H, self.D = case["B"], case["H"], case["D"]
        self.dtype = _DTYPES[case["dtype"]]

    def block(self, n: int):
        k = self.rng.standard_normal((self.B, self.H, n, self.D), dtype=np.float32)
        v = self.rng.standard_normal((self.B, self.H, n, self.D), dtype=np.float32)
        return mx.array(k).astype(self.dtype), mx.array(v).astype(self.dtype)


def _make(spec: list):
    cls, *args = spec
    return getattr(mlx_cache, cls)(*args)


def _updates(steps: list[str]) -> list[int]:
    """The token counts of the updates a step list makes (one entry per update_and_fetch)."""
    out = []
    for s in steps:
        if s[0] == "p":
            out.append(int(s[1:]))
        elif s[0] == "d":
            out += [1] * int(s[1:])
    return out


def _run(cache, steps: list[str], blocks: list, trace: list | None = None):
    """Applies the steps; returns the (possibly replaced) cache. `blocks` are consumed in order."""
    it = iter(blocks)
    for s in steps:
        if s[0] in "pd":
            for _ in range(1 if s[0] == "p" else int(s[1:])):
                k, v = next(it)
                out = cache.update_and_fetch(k, v)
                mx.eval(out)
                if trace is not None:
                    trace.append((out, cache.offset))
        elif s[0] == "t":
            cache.trim(int(s[1:]))
        elif s == "front":
            cache.maybe_trim_front()
        elif s[0] == "q":
            group, bits = (int(x) for x in s[1:].split(":"))
            cache = cache.to_quantized(group_size=group, bits=bits)
        else:
            raise ValueError(f"unknown step '{s}'")
    return cache


# Upstream (mlx-lm 0.32.2): from_state builds the object with __new__ and sets only the
# `state` fields, so a loaded BatchRotatingKVCache has no _lengths (its first update
# raises AttributeError) and a loaded BatchKVCache no _right_padding (finalize raises).
# Neither is in the file, so no writer can fix it; the loader's caller sets the
# constructor's defaults, as __init__ would have.
_UNSET_BY_FROM_STATE = {"BatchRotatingKVCache": "_lengths", "BatchKVCache": "_right_padding"}


def _load(path: Path, notes: set[str]):
    caches, meta = mlx_cache.load_prompt_cache(str(path), return_metadata=True)
    for c in caches:
        attr = _UNSET_BY_FROM_STATE.get(type(c).__name__)
        if attr and not hasattr(c, attr):
            setattr(c, attr, None)
            notes.add(f"upstream: load_prompt_cache leaves {type(c).__name__}.{attr} unset (set to None here)")
    return caches, meta


def _kvlab(kvlab: str, *args: str) -> None:
    r = subprocess.run([kvlab, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kvlab {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")


def _continued_equal(a: mlx_cache._BaseCache, b, blocks: list, steps: list[str]) -> str | None:
    ta, tb = [], []
    _run(a, steps, blocks, ta)
    _run(b, steps, blocks, tb)
    for i, ((oa, fa), (ob, fb)) in enumerate(zip(ta, tb)):
        if not _same(fa, fb):
            return f"update {i}: offset {fa} != {fb}"
        if not _same(oa, ob):
            return f"update {i}: returned keys/values differ"
    return None


def _kvlab_files_equal(x: Path, y: Path) -> str | None:
    ax, mx_ = mx.load(str(x), return_metadata=True)
    ay, my = mx.load(str(y), return_metadata=True)
    if mx_ != my:
        diff = {k: (mx_.get(k), my.get(k)) for k in set(mx_) | set(my) if mx_.get(k) != my.get(k)}
        return f"metadata differs: {diff}"
    if set(ax) != set(ay):
        return f"tensor names differ: {sorted(set(ax) ^ set(ay))}"
    for k in sorted(ax):
        if not _same(ax[k], ay[k]):
            return f"tensor {k} differs"
    return None


def run_case(case: dict, kvlab: str, work: Path, seed: int) -> list[str]:
    """Returns one line per check: 'ok ...' or 'FAIL ...'."""
    name = case["name"]
    src = _Source(case, seed)
    before, after = case["before"], case["after"]
    pre_blocks = [src.block(n) for n in _updates(before)]
    post_blocks = [src.block(n) for n in _updates(after)]
    cache = _run(_make(case["make"]), before, pre_blocks)
    cls = type(cache).__name__

    orig = work / f"{name}.mlx.safetensors"
    as_kvlab = work / f"{name}.kvlab.safetensors"
    back = work / f"{name}.kvlab-written.safetensors"
    mlx_cache.save_prompt_cache(str(orig), [cache], {"case": name})
    _kvlab(kvlab, "cache", "convert", str(orig), str(as_kvlab))
    _kvlab(kvlab, "cache", "convert", str(as_kvlab), str(back), "--to", "mlx-lm")

    lines = []
    notes: set[str] = set()
    loaded, meta = _load(back, notes)
    problem = None if meta == {"case": name} else f"user metadata came back as {meta}"
    # The original continues on a reloaded copy of itself, so the kvlab-continue check
    # below starts from the same saved state.
    original = _load(orig, notes)[0][0]
    problem = problem or _continued_equal(original, loaded[0], post_blocks, after)
    lines.append(f"{'FAIL' if problem else 'ok'} {name} ({cls}): mlx-lm -> kvlab -> mlx-lm, continued "
                 f"{len(post_blocks)} update(s){': ' + problem if problem else ', bit-exact'}")

    # kvlab's own caches continue the mlx-lm file.
    if any(s[0] in "tq" for s in after):
        lines.append(f"skip {name}: kvlab cache continue applies updates only")
        return lines + [f"note {name}: {n}" for n in sorted(notes)]
    steps = work / f"{name}.steps.safetensors"
    mx.save_safetensors(str(steps), {f"0.{i}.{side}": kv[j] for i, kv in enumerate(post_blocks)
                                     for j, side in enumerate(("keys", "values"))})
    by_kvlab = work / f"{name}.continued-by-kvlab.safetensors"
    _kvlab(kvlab, "cache", "continue", str(orig), "--steps", str(steps), "-o", str(by_kvlab))
    ref = _load(orig, notes)[0][0]
    ref = _run(ref, after, post_blocks)
    by_mlx = work / f"{name}.continued-by-mlx.safetensors"
    mlx_cache.save_prompt_cache(str(by_mlx), [ref], {"case": name})
    by_mlx_kvlab = work / f"{name}.continued-by-mlx.kvlab.safetensors"
    _kvlab(kvlab, "cache", "convert", str(by_mlx), str(by_mlx_kvlab))
    problem = _kvlab_files_equal(by_kvlab, by_mlx_kvlab)
    lines.append(f"{'FAIL' if problem else 'ok'} {name} ({cls}): kvlab continues the mlx-lm file "
                 f"{len(post_blocks)} update(s){': ' + problem if problem else ', state bit-exact'}")

    # mlx-lm continues what kvlab's caches wrote in its format, like its own continuation.
    by_kvlab_mlx = work / f"{name}.continued-by-kvlab.mlx.safetensors"
    _kvlab(kvlab, "cache", "continue", str(orig), "--steps", str(steps), "-o", str(by_kvlab_mlx), "--to", "mlx-lm")
    more = ["d2"]
    problem = _continued_equal(ref, _load(by_kvlab_mlx, notes)[0][0], [src.block(1) for _ in range(2)], more)
    lines.append(f"{'FAIL' if problem else 'ok'} {name} ({cls}): mlx-lm continues kvlab's continuation "
                 f"2 update(s){': ' + problem if problem else ', bit-exact'}")
    return lines + [f"note {name}: {n}" for n in sorted(notes)]


def main(kvlab: str, work: str, only: list[str] | None, seed: int) -> int:
    cases = json.loads(CASES.read_text())["cases"]
    if only:
        unknown = set(only) - {c["name"] for c in cases}
        if unknown:
            raise ValueError(f"unknown case(s) {sorted(unknown)}")
        cases = [c for c in cases if c["name"] in only]
    w = Path(work)
    w.mkdir(parents=True, exist_ok=True)
    failed = 0
    for case in cases:
        try:
            lines = run_case(case, kvlab, w, seed)
        except Exception as e:  # a crash of one case is that case's failure
            lines = [f"FAIL {case['name']}: {type(e).__name__}: {e}"]
        for line in lines:
            print(line)
            failed += line.startswith("FAIL")
    print(f"{len(cases)} case(s), {failed} failed check(s) (mlx {mx.__version__}, seed {seed})")
    return 1 if failed else 0
