"""kvlab ops computed by real MLX (Python API) and mlx-lm.

Each function takes a parsed problem line and the problem's inputs as MLX arrays (the
names of kvlab's harness/ops/*_info.cc prepare()) and returns its outputs by kvlab's
slot names. Layouts are kvlab's and MLX's alike (dense row-major, attention (B, H, T, D),
codes as u32 words packed LSB first), so arrays pass through unchanged.

A problem MLX cannot express raises Unsupported with the reason. The functions never
adjust MLX's values: kvlab judges what MLX computes.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .problem import Problem


class Unsupported(Exception):
    """The problem has a parameter MLX (as routed here) has no equivalent for."""


# The only MLX device this adapter runs. MLX computes its own arithmetic, which kvlab
# names the `mlx` flavour (rounding=mlx, bit-exact in the oracle); mlx_cpu is kvlab's
# single-rounding contract and mlx_gpu Metal's arithmetic, neither computed here.
DEVICE = mx.cpu
FLAVOUR = "mlx"

# MLX's defaults per fp mode (kvlab's QuantSpec::make): (bits, group).
FP_SPECS = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}


def _require_cpu_rounding(p: Problem):
    r = p.word("rounding")
    if r != FLAVOUR:
        raise Unsupported(f"rounding={r}: MLX computes the mlx flavour (rounding=mlx), not kvlab's {r}")


def vtag(arr) -> str:
    return str(arr.dtype).removeprefix("mlx.core.")


def _mx_dtype(name: str):
    return {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}[name]


# ---- quantization -----------------------------------------------------------------

def affine_quantize(p: Problem, inp):
    _require_cpu_rounding(p)
    wq, scales, biases = mx.quantize(inp["x"], group_size=p.int("group"), bits=p.int("bits"), mode="affine")
    return {"wq": wq, "scales": scales, "biases": biases}


def affine_dequantize(p: Problem, inp):
    # MLX computes in the metadata dtype T (two roundings for f16/bf16): only the mlx
    # flavour asks for that; for f32 every flavour is the same arithmetic.
    if p.word("dtype") != "f32":
        _require_cpu_rounding(p)
    out = mx.dequantize(inp["wq"], inp["scales"], inp["biases"], group_size=p.int("group"), bits=p.int("bits"),
                        mode="affine")
    return {"out": out}


def _fp_mode(p: Problem):
    mode = p.word("mode")
    if mode not in FP_SPECS:
        raise Unsupported(f"mode={mode}: not an MLX fp quantization mode")
    return mode, *FP_SPECS[mode]


def _global_scale(p: Problem, inp, x=None):
    """nvfp4's tensor-wide scale: None, or an f32 scalar array. kvlab defines it as the
    amax of the quantized tensor x (MLX's convention); a file may carry it explicitly as
    the input 'global_scale', which then wins."""
    gs = p.word("global_scale", "none")
    if gs == "none":
        return None
    if gs != "amax":
        raise Unsupported(f"global_scale={gs}: unknown global scale rule")
    if "global_scale" in inp:
        return inp["global_scale"].astype(mx.float32).reshape(())
    if x is None:
        raise Unsupported("global_scale=amax: the amax of the x kvlab quantized is not in the file "
                          "(no 'global_scale' input), and dequantize has only the codes")
    return mx.max(mx.abs(x.astype(mx.float32)))


def fp_quantize(p: Problem, inp):
    _require_cpu_rounding(p)
    mode, bits, group = _fp_mode(p)
    x = inp["x"]
    gs = _global_scale(p, inp, x)
    kwargs = {} if gs is None else {"global_scale": gs}
    wq, scales = mx.quantize(x, group_size=group, bits=bits, mode=mode, **kwargs)
    return {"wq": wq, "scales": scales}


def fp_dequantize(p: Problem, inp):
    # As affine_dequantize: the rounding flavour only made the input codes.
    mode, bits, group = _fp_mode(p)
    gs = _global_scale(p, inp)
    kwargs = {} if gs is None else {"global_scale": gs}
    # MLX's own dtype argument: without it fp modes dequantize to bf16.
    out = mx.dequantize(inp["wq"], inp["scales"], None, group_size=group, bits=bits, mode=mode,
                        dtype=_mx_dtype(p.word("dtype")), **kwargs)
    return {"out": out}


# ---- rope ---------------------------------------------------------------------------

def rope_freqs(p: Problem):
    """kvlab's explicit wavelengths (harness/ops/rope_info.cc), or None for base^(-2i/dims)."""
    kind = p.word("freqs", "none")
    half = p.int("dims") // 2
    if kind == "none":
        return None
    if kind == "ramp":
        return np.array([1 + 37 * i for i in range(half)], dtype=np.float32)
    if kind == "tiny":
        return np.array([(1.0, 0.5, 0.1, 1e-3)[i % 4] for i in range(half)], dtype=np.float32)
    raise Unsupported(f"freqs={kind}: unknown frequency rule")


def rope(p: Problem, inp):
    freqs = rope_freqs(p)
    if p.flag("per_row", 0):
        if "offsets" not in inp:
            raise ValueError("rope per_row=1 without an 'offsets' input")
        offset = inp["offsets"]
    else:
        offset = p.int("offset")
        if not -2**31 <= offset < 2**31:
            raise Unsupported(f"offset={offset} does not fit MLX's int32 offset")
    out = mx.fast.rope(inp["x"], p.int("dims"), traditional=p.flag("traditional"),
                       base=None if freqs is not None else p.real("base"), scale=p.real("scale"), offset=offset,
                       freqs=None if freqs is None else mx.array(freqs))
    return {"out": out}


# ---- attention ------------------------------------------------------------------------

def _paddings(p: Problem, key: str):
    """Per batch row ⌊pad·b/(B−1)⌋ (pad itself when B = 1), as sdpa_info.cc; None for 0."""
    pad, B = p.int(key), p.int("B")
    if pad == 0 or p.word("mask") != "causal":
        return None
    return np.array([pad * b // (B - 1) if B > 1 else pad for b in range(B)], dtype=np.int32)


def _to_f32(arr):
    return np.array(arr.astype(mx.float32))


def attention_mask(p: Problem, inp):
    """(the mask MLX gets, visibility as a numpy bool array broadcastable to (B, Hq, Lq, Lk)).

    Plain causal is MLX's own "causal" (lower right); with a window or paddings it is
    mlx-lm's create_causal_mask, the array mlx-lm's models hand to MLX."""
    kind = p.word("mask")
    Lq, Lk = p.int("Lq"), p.int("Lk")
    if kind == "none":
        return None, np.ones((1, 1, Lq, Lk), dtype=bool)
    if kind == "causal":
        window = p.int("window")
        lpad, rpad = _paddings(p, "lpad"), _paddings(p, "rpad")
        i = np.arange(Lq)[:, None] + (Lk - Lq)
        j = np.arange(Lk)[None, :]
        vis = (i >= j) & ((i < j + window) if window else True)
        vis = np.broadcast_to(vis, (1, 1, Lq, Lk))
        if lpad is not None:
            vis = vis & (j >= lpad[:, None, None, None])
        if rpad is not None:
            vis = vis & (j < Lk - rpad[:, None, None, None])
        if not window and lpad is None and rpad is None:
            return "causal", vis
        from mlx_lm.models.base import create_causal_mask
        mask = create_causal_mask(Lq, offset=Lk - Lq, window_size=window or None,
                                  right_padding=None if rpad is None else mx.array(rpad),
                                  left_padding=None if lpad is None else mx.array(lpad))
        return mask, vis
    if kind == "bool":
        m = inp["mask"]
        return m.astype(mx.bool_), np.array(m) != 0
    if kind == "additive":
        m = inp["mask"]
        q = inp["q"]
        if p.op == "sdpa" and mx.result_type(m, q) != q.dtype:
            raise Unsupported(f"additive mask in {p.word('mask_dtype')} with {p.word('dtype')} q: MLX's attention "
                              "requires the mask's dtype to promote to q's")
        return m, ~np.isneginf(_to_f32(m))
    raise Unsupported(f"mask={kind}: unknown mask kind")


def _check_fully_masked_policy(p: Problem, vis):
    """MLX's CPU backend has only the fallback attention: it reads every key (a hidden
    key's NaN poison reaches the output through a zero weight) and averages V over a row
    that sees nothing. kvlab's fully_masked=zero is the fused kernel's contract, so such
    problems are MLX-GPU behaviour, unless the mask hides nothing that matters."""
    policy = p.word("fully_masked")
    if policy == "mean_of_values":
        return
    if policy != "zero":
        raise Unsupported(f"fully_masked={policy}: unknown policy")
    B, Hq, Hkv, Lq, Lk = (p.int(k) for k in ("B", "Hq", "Hkv", "Lq", "Lk"))
    if Hkv <= 0 or Hq % Hkv:
        return  # an invalid problem: let MLX reject it
    vis = np.broadcast_to(vis, (B, Hq, Lq, Lk))
    if not vis.any(axis=-1).all():
        raise Unsupported("fully_masked=zero with a fully masked query row: MLX's CPU backend has only the "
                          "fallback (mean of V), the zero policy is the fused kernel's")
    seen = vis.reshape(B, Hkv, Hq // Hkv, Lq, Lk).any(axis=(2, 3))
    if not seen.all():
        raise Unsupported("fully_masked=zero with keys no query sees (kvlab poisons them): MLX's CPU backend "
                          "has only the fallback, which reads every key")


def _scale(p: Problem):
    s = p.real("scale")
    return s if s != 0 else 1.0 / math.sqrt(p.int("Dk"))


def _no_softcap(p: Problem):
    if p.real("softcap") != 0:
        raise Unsupported("softcap: MLX's scaled_dot_product_attention has no logit softcap")


def sdpa(p: Problem, inp):
    _no_softcap(p)
    mask, vis = attention_mask(p, inp)
    _check_fully_masked_policy(p, vis)
    if p.flag("sinks") != ("sinks" in inp):
        raise ValueError(f"sinks={p.int('sinks')} but the file {'lacks' if p.flag('sinks') else 'has'} a 'sinks' input")
    if "sinks" in inp and mx.result_type(inp["sinks"], inp["q"]) != inp["q"].dtype:
        raise Unsupported(f"{vtag(inp['sinks'])} sinks with {p.word('dtype')} q: MLX's attention requires the sinks' "
                          "dtype to promote to q's (kvlab's sinks are f32)")
    out = mx.fast.scaled_dot_product_attention(inp["q"], inp["k"], inp["v"], scale=_scale(p), mask=mask,
                                               sinks=inp.get("sinks"))
    return {"out": out}


def quantized_sdpa(p: Problem, inp):
    """mlx-lm's own quantized attention (models/base.py), as mlx-lm's models call it."""
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    _no_softcap(p)
    for side in "kv":
        if p.word(side + "mode") != "affine":
            raise Unsupported(f"{side}mode={p.word(side + 'mode')}: mlx-lm's quantized attention passes no mode "
                              "to quantized_matmul (affine only)")
    if (p.int("kbits"), p.int("kgroup")) != (p.int("vbits"), p.int("vgroup")):
        raise Unsupported("different K and V quantization: mlx-lm's quantized attention takes one bits/group_size")
    if p.flag("sinks"):
        raise Unsupported("sinks: mlx-lm's quantized attention has no attention sinks")
    if p.word("mask") in ("bool", "additive") and p.word("mask_dims")[1] == "H" and p.int("Hq") > p.int("Hkv"):
        raise Unsupported("per-head mask with Hq > Hkv: mlx-lm's quantized attention broadcasts only masks "
                          "without a head axis over grouped query heads")
    if p.int("Dv") != p.int("Dk") and p.int("Hq") > p.int("Hkv"):
        raise Unsupported("Dv != Dk with Hq > Hkv: mlx-lm's quantized attention reshapes the output with q's D")
    mask, vis = attention_mask(p, inp)
    _check_fully_masked_policy(p, vis)
    keys = (inp["kwq"], inp["kscales"], inp["kbiases"])
    values = (inp["vwq"], inp["vscales"], inp["vbiases"])
    out = quantized_scaled_dot_product_attention(inp["q"], keys, values, scale=_scale(p), mask=mask,
                                                 group_size=p.int("kgroup"), bits=p.int("kbits"))
    return {"out": out}


# op name -> (function, the route it takes, for the report and the file's flavour)
OPS = {
    "affine_quantize": (affine_quantize, "mlx.core.quantize"),
    "affine_dequantize": (affine_dequantize, "mlx.core.dequantize"),
    "fp_quantize": (fp_quantize, "mlx.core.quantize"),
    "fp_dequantize": (fp_dequantize, "mlx.core.dequantize"),
    "rope": (rope, "mlx.core.fast.rope"),
    "sdpa": (sdpa, "mlx.core.fast.scaled_dot_product_attention"),
    "quantized_sdpa": (quantized_sdpa, "mlx_lm.models.base.quantized_scaled_dot_product_attention"),
}

# The cache op: kvlab's command scripts replayed through mlx-lm's cache classes
# (cache_replay.py imports Unsupported from here, so it is loaded at the first call).
class EngineRaised(Exception):
    """The engine raised on a problem kvlab calls valid: a finding, not a limit."""


def cache(p: Problem, inp):
    from .cache_replay import replay

    return replay(p, inp)


OPS["cache"] = (cache, "mlx_lm.models.cache")
