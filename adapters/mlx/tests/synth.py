"""Stand-in for `kvlab vectors write` until it exists: kvlab-shaped problems from lines.

For a problem line it makes the inputs and output slots that kvlab's harness/ops/*_info.cc
prepare() makes (names, dtypes, shapes), filled with numpy random data instead of kvlab's
counter RNG, and the outputs zero-filled (kvlab would put its oracle's results there).
Quantized inputs come from mx.quantize (kvlab's oracle reproduces it). Lines may leave
parameters out: the op's defaults (`kvlab list`) fill them in.

Run as a script, it expands kvlab case files (product syntax) into a vectors file:
  python tests/synth.py harness/cases/rope/ci ... -o synth.safetensors
"""

from __future__ import annotations

import itertools
import sys
import zlib

import mlx.core as mx
import numpy as np

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from kvlab_mlx import vectors as V  # noqa: E402
from kvlab_mlx.problem import Problem  # noqa: E402

# `kvlab list` defaults (quiet keys and `place` left out).
DEFAULTS = {
    "affine_quantize": "B=1 H=1 T=4 D=64 dtype=f32 bits=4 group=64 rounding=mlx dist=normal seed=1",
    "fp_quantize": "B=1 H=1 T=4 D=64 dtype=f32 mode=mxfp4 rounding=mlx global_scale=none seed=1",
    "rope": "B=1 H=4 T=8 D=64 dtype=f32 dims=64 traditional=0 base=10000 scale=1 offset=0 per_row=0 seed=1",
    "sdpa": "B=1 Hq=4 Hkv=4 Lq=4 Lk=16 Dk=64 Dv=64 dtype=f32 mask=none window=0 lpad=0 rpad=0 sinks=0 softcap=0 "
            "scale=0 fully_masked=zero mask_dims=B1 mask_dtype=f32 special=none seed=1",
    "quantized_sdpa": "B=1 Hq=4 Hkv=4 Lq=4 Lk=16 Dk=64 Dv=64 dtype=f32 mask=none window=0 lpad=0 rpad=0 sinks=0 "
                      "softcap=0 scale=0 fully_masked=zero mask_dims=B1 mask_dtype=f32 kmode=affine kbits=4 "
                      "kgroup=64 vmode=affine vbits=4 vgroup=64 kdtype=q vdtype=q seed=1",
}
DEFAULTS["affine_dequantize"] = DEFAULTS["affine_quantize"]
DEFAULTS["fp_dequantize"] = DEFAULTS["fp_quantize"]
FP = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}
MX = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
TAG = {"f32": "F32", "f16": "F16", "bf16": "BF16"}


def canonical(line: str) -> str:
    """The line with every default filled in, kvlab's key order (defaults first)."""
    op, *rest = line.split()
    given = dict(t.split("=", 1) for t in rest)
    out = [op]
    for tok in DEFAULTS[op].split():
        k, v = tok.split("=", 1)
        out.append(f"{k}={given.pop(k, v)}")
    out[-1:-1] = [f"{k}={v}" for k, v in given.items() if k != "place"]  # quiet keys before seed
    return " ".join(out)


def _normal(rng, shape, dtype, stddev=1.0):
    return V.from_mlx(mx.array((rng.standard_normal(shape) * stddev).astype(np.float32)).astype(MX[dtype]))


def _zeros(tag, shape):
    return V.Tensor(tag, np.zeros(shape, dtype=V.DTYPES[tag]))


def _quantized(x: V.Tensor, mode, bits, group):
    r = mx.quantize(V.to_mlx(x), group_size=group, bits=bits, mode=mode)
    return [V.from_mlx(a) for a in r]


def synth(line: str) -> V.Problem:
    p = Problem(canonical(line))
    rng = np.random.default_rng(zlib.crc32(p.line.encode()))
    op, g = p.op, p.int
    vp = V.Problem(p.line)
    if op in ("affine_quantize", "affine_dequantize", "fp_quantize", "fp_dequantize"):
        dt = p.word("dtype")
        shape = (g("B"), g("H"), g("T"), g("D"))
        if op.startswith("affine"):
            mode, bits, group = "affine", g("bits"), g("group")
        else:
            mode, (bits, group) = p.word("mode"), FP[p.word("mode")]
        if p.word("dist", "normal") == "grid":
            x = V.from_mlx(mx.array(rng.integers(-16, 17, shape).astype(np.float32) / 4).astype(MX[dt]))
        else:
            x = _normal(rng, shape, dt, p.real("stddev", "1"))
        lead = shape[:-1]
        if op.endswith("_quantize"):
            vp.inputs["x"] = x
            vp.outputs["wq"] = _zeros("U32", lead + (shape[-1] * bits // 32,))
            stag = TAG[dt] if mode == "affine" else "U8"
            vp.outputs["scales"] = _zeros(stag, lead + (shape[-1] // group,))
            if mode == "affine":
                vp.outputs["biases"] = _zeros(stag, lead + (shape[-1] // group,))
        else:
            q = _quantized(x, mode, bits, group)
            for name, t in zip(("wq", "scales", "biases"), q):
                vp.inputs[name] = t
            vp.outputs["out"] = _zeros(TAG[dt], shape)
    elif op == "rope":
        dt, B, H, T, D = p.word("dtype"), g("B"), g("H"), g("T"), g("D")
        shape = {3: (B, T, D), 4: (B, H, T, D), 5: (B, H, 1, T, D)}[g("rank", 4)]
        vp.inputs["x"] = _normal(rng, shape, dt)
        if p.flag("per_row"):
            step = g("row_step", 7)
            vp.inputs["offsets"] = V.Tensor("I32", np.array(
                [g("offset") + step * b - 3 * (b % 2) for b in range(B)], dtype=np.int32))
        vp.outputs["out"] = _zeros(TAG[dt], shape)
    elif op in ("sdpa", "quantized_sdpa"):
        dt = p.word("dtype")
        B, Hq, Hkv, Lq, Lk, Dk, Dv = (g(k) for k in ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv"))
        vp.inputs["q"] = _normal(rng, (B, Hq, Lq, Dk), dt)
        if op == "sdpa":
            vp.inputs["k"] = _normal(rng, (B, Hkv, Lk, Dk), dt)
            vp.inputs["v"] = _normal(rng, (B, Hkv, Lk, Dv), dt)
        else:
            for s, D in (("k", Dk), ("v", Dv)):
                kvdt = p.word(s + "dtype")
                x = _normal(rng, (B, Hkv, Lk, D), dt if kvdt == "q" else kvdt)
                mode = p.word(s + "mode")
                bits, group = (g(s + "bits"), g(s + "group")) if mode == "affine" else FP[mode]
                for name, t in zip(("wq", "scales", "biases"), _quantized(x, mode, bits, group)):
                    vp.inputs[s + name] = t
        kind = p.word("mask")
        if kind in ("bool", "additive"):
            dims = p.word("mask_dims")
            mshape = (B if dims[0] == "B" else 1, Hq if dims[1] == "H" else 1, Lq, Lk)
            keep = rng.random(mshape) < 0.75
            keep.reshape(-1)[:Lk] = False  # query row 0 of the first slice fully masked, as kvlab does
            if kind == "bool":
                vp.inputs["mask"] = V.Tensor("U8", keep.astype(np.uint8))
            else:
                bias = np.where(keep, 0.5 * (rng.random(mshape) - 0.5), -np.inf).astype(np.float32)
                vp.inputs["mask"] = V.from_mlx(mx.array(bias).astype(MX[p.word("mask_dtype")]))
        if p.flag("sinks"):
            vp.inputs["sinks"] = V.Tensor("F32", rng.standard_normal(Hq).astype(np.float32))
        vp.outputs["out"] = _zeros(TAG[dt], (B, Hq, Lq, Dv))
    else:
        raise ValueError(f"synth: no inputs recipe for op {op}")
    return vp


def expand(case_line: str):
    """kvlab's product syntax: `k=a,b` lists, first listed key varying slowest."""
    op, *toks = case_line.split()
    keys = [t.split("=", 1)[0] for t in toks]
    lists = [t.split("=", 1)[1].split(",") for t in toks]
    for combo in itertools.product(*lists):
        yield " ".join([op] + [f"{k}={v}" for k, v in zip(keys, combo)])


def main(argv):
    out = argv[argv.index("-o") + 1]
    files = [a for a in argv if a != "-o" and a != out]
    problems, failed = [], 0
    for f in files:
        for raw in open(f):
            raw = raw.split("#", 1)[0].strip()
            if not raw:
                continue
            for line in expand(raw):
                try:
                    problems.append(synth(line))
                except Exception as e:  # a recipe this stand-in lacks; kvlab itself is the real source
                    failed += 1
                    print(f"synth: {line}: {type(e).__name__}: {e}", file=sys.stderr)
    meta = {"engine": "kvlab-synth", "engine_version": "0", "flavour": "synthetic", "writer": "adapters/mlx/tests/synth.py"}
    V.write(out, V.Vectors(meta, problems))
    print(f"wrote {out}: {len(problems)} problems ({failed} lines without a recipe)")


if __name__ == "__main__":
    main(sys.argv[1:])
