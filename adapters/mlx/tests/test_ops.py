"""The problem parser, each op route against an independent numpy computation, and the
runner. Expected values come from the formulas of kvlab's contracts (reference/*.h),
computed here in numpy, not from MLX."""

import math
import unittest

import mlx.core as mx
import numpy as np

from kvlab_mlx import ops
from kvlab_mlx import vectors as V
from kvlab_mlx.problem import Problem
from kvlab_mlx.run import recompute

ATTN = ("B={B} Hq={Hq} Hkv={Hkv} Lq={Lq} Lk={Lk} Dk={Dk} Dv={Dv} dtype=f32 mask={mask} window={window} lpad={lpad} "
        "rpad={rpad} sinks={sinks} softcap={softcap} scale={scale} fully_masked={fm} mask_dims={md} mask_dtype=f32")


def attn_line(op="sdpa", extra="", **kw):
    d = dict(B=1, Hq=1, Hkv=1, Lq=1, Lk=1, Dk=4, Dv=4, mask="none", window=0, lpad=0, rpad=0, sinks=0, softcap=0,
             scale=0, fm="zero", md="B1")
    d.update(kw)
    return Problem(f"{op} {ATTN.format(**d)} {extra} seed=1".replace("  ", " "))


def pack(codes, bits):
    """LSB-first bitstream per row (reference/bitpack.h)."""
    codes = np.asarray(codes, dtype=np.uint64)
    rows = codes.reshape(-1, codes.shape[-1])
    words = np.zeros((rows.shape[0], rows.shape[1] * bits // 32), dtype=np.uint64)
    for r, row in enumerate(rows):
        for i, c in enumerate(row):
            for b in range(bits):
                k = i * bits + b
                words[r, k // 32] |= ((int(c) >> b) & 1) << (k % 32)
    return words.astype(np.uint32).reshape(codes.shape[:-1] + (-1,))


def unpack(words, bits, n):
    words = np.asarray(words, dtype=np.uint64)
    out = np.zeros(words.shape[:-1] + (n,), dtype=np.int64)
    for i in range(n):
        for b in range(bits):
            k = i * bits + b
            out[..., i] |= ((words[..., k // 32] >> (k % 32)) & 1).astype(np.int64) << b
    return out


def affine_group_numpy(g, bits):
    """kvlab's affine contract (reference/affine_quantize.h), mlx_cpu, in f32."""
    g = np.asarray(g, dtype=np.float32)
    n = np.float32(2**bits - 1)
    alpha, beta = g.max(), g.min()
    s0 = max(np.float32((alpha - beta) / n), np.float32(1e-7))
    side = abs(beta) > abs(alpha)
    s1 = s0 if side else -s0
    edge = beta if side else alpha
    q0 = np.rint(np.float32(edge / s1))
    scale, bias = (np.float32(edge / q0), edge) if q0 != 0 else (s1, np.float32(0))
    codes = np.clip(np.rint((g - bias) / scale), 0, n).astype(np.int64)
    return codes, scale, bias


def attention_numpy(q, k, v, scale, vis=None, sinks=None):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    r = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, r, axis=1), np.repeat(v, r, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if vis is not None:
        s = np.where(np.broadcast_to(vis, s.shape), s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None],
                                               s.shape[:-1] + (1,))], axis=-1)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", w[..., :k.shape[2]], v)


class ProblemLine(unittest.TestCase):
    def test_parse(self):
        p = Problem("rope B=2 H=4 dtype=bf16 base=10000 scale=-0.5 seed=7")
        self.assertEqual(p.op, "rope")
        self.assertEqual((p.int("B"), p.word("dtype"), p.real("base"), p.real("scale")), (2, "bf16", 1e4, -0.5))
        self.assertEqual(p.int("rank", 4), 4)  # a quiet key left out of the canonical line
        self.assertTrue(Problem("x a=1").flag("a"))

    def test_rejects(self):
        for line in ("", "Rope B=1", "rope B", "rope B=", "rope =1", "rope B=1 B=2", "rope B=1,2", "rope 1B=2"):
            with self.subTest(line=line), self.assertRaises(ValueError):
                Problem(line)
        p = Problem("rope B=x T=1.5")
        for call in (lambda: p.int("B"), lambda: p.int("T"), lambda: p.real("B"), lambda: p.int("missing")):
            with self.assertRaises(ValueError):
                call()


class Quantize(unittest.TestCase):
    def test_affine_8bit_known_group(self):
        # One group of 32 grid values k/4: extremes 3.75 and -2.5, so the max dominates
        # (negative scale) and the codes land on exact rounding ties.
        g = (np.array([(i * 7) % 26 - 10 for i in range(32)], dtype=np.float32)) / 4
        g[3], g[9] = 3.75, -2.5
        codes, scale, bias = affine_group_numpy(g, 8)
        p = Problem("affine_quantize B=1 H=1 T=1 D=32 dtype=f32 bits=8 group=32 rounding=mlx dist=grid seed=1")
        out = ops.affine_quantize(p, {"x": mx.array(g.reshape(1, 1, 1, 32))})
        self.assertLess(scale, 0)
        self.assertEqual(np.array(out["wq"]).tolist(), pack(codes, 8).reshape(1, 1, 1, 8).tolist())
        self.assertEqual(np.array(out["scales"]).item(), scale)
        self.assertEqual(np.array(out["biases"]).item(), bias)

    def test_affine_4bit_packing_and_dequantize(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((1, 2, 3, 64)).astype(np.float32)
        p = Problem("affine_quantize B=1 H=2 T=3 D=64 dtype=f32 bits=4 group=32 rounding=mlx dist=normal seed=1")
        out = ops.affine_quantize(p, {"x": mx.array(x)})
        self.assertEqual(out["wq"].shape, (1, 2, 3, 8))
        codes = unpack(np.array(out["wq"]), 4, 64)
        for r in range(6):
            for grp in range(2):
                c, s, b = affine_group_numpy(x.reshape(6, 64)[r, grp * 32:(grp + 1) * 32], 4)
                self.assertEqual(codes.reshape(6, 64)[r, grp * 32:(grp + 1) * 32].tolist(), c.tolist())
                self.assertEqual(np.array(out["scales"]).reshape(6, 2)[r, grp], s)
        dq = ops.affine_dequantize(p, out)["out"]
        scales = np.repeat(np.array(out["scales"]), 32, axis=-1)
        biases = np.repeat(np.array(out["biases"]), 32, axis=-1)
        want = (codes.astype(np.float32) * scales + biases).astype(np.float32)  # multiply, then add, in f32
        self.assertEqual(np.array(dq).tolist(), want.tolist())

    def test_gpu_rounding_is_not_expressible(self):
        x = {"x": mx.zeros((1, 1, 1, 32))}
        for op, line in ((ops.affine_quantize, "affine_quantize bits=4 group=32 rounding=mlx_gpu"),
                         (ops.fp_quantize, "fp_quantize mode=mxfp4 rounding=mlx_gpu global_scale=none"),
                         (ops.fp_quantize, "fp_quantize mode=mxfp4 rounding=mlx_gpu_fast global_scale=none")):
            with self.subTest(line=line), self.assertRaises(ops.Unsupported):
                op(Problem(line), x)

    def test_mxfp4_exact_values(self):
        # amax 6 -> E8M0 scale 2^0 (code 127); every value is on the E2M1 grid.
        lut = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
        idx = np.array([(i * 3) % 8 for i in range(32)])
        idx[5] = 7
        sign = np.array([i % 3 == 0 for i in range(32)])
        x = np.where(sign, -1, 1) * np.array([lut[i] for i in idx], dtype=np.float32)
        # mlx_cpu encodes by argmin over the 16-entry LUT, ties to the lower index: -0 -> +0.
        codes = np.where(idx == 0, 0, idx + 8 * sign)
        p = Problem("fp_quantize B=1 H=1 T=1 D=32 dtype=f32 mode=mxfp4 rounding=mlx global_scale=none seed=1")
        out = ops.fp_quantize(p, {"x": mx.array(x.reshape(1, 1, 1, 32).astype(np.float32))})
        self.assertEqual(np.array(out["scales"]).tolist(), [[[[127]]]])
        self.assertEqual(out["scales"].dtype, mx.uint8)
        self.assertEqual(np.array(out["wq"]).tolist(), pack(codes, 4).reshape(1, 1, 1, 4).tolist())
        back = ops.fp_dequantize(Problem(p.line.replace("fp_quantize", "fp_dequantize")), out)["out"]
        self.assertEqual(back.dtype, mx.float32)
        self.assertEqual(np.array(back).reshape(-1).tolist(), x.tolist())

    def test_nvfp4_global_scale(self):
        x = mx.array(np.random.default_rng(1).standard_normal((1, 1, 2, 32)).astype(np.float32))
        line = "fp_quantize B=1 H=1 T=2 D=32 dtype=f32 mode=nvfp4 rounding=mlx global_scale=amax seed=1"
        out = ops.fp_quantize(Problem(line), {"x": x})
        amax = mx.max(mx.abs(x))
        plain = mx.quantize(x, group_size=16, bits=4, mode="nvfp4")
        scaled = mx.quantize(x, group_size=16, bits=4, mode="nvfp4", global_scale=amax)
        self.assertTrue(mx.array_equal(out["scales"], scaled[1]).item())
        self.assertFalse(mx.array_equal(out["scales"], plain[1]).item())  # the global scale was used
        deq = Problem(line.replace("fp_quantize", "fp_dequantize"))
        with self.assertRaises(ops.Unsupported):  # the amax of x is not among dequantize's inputs
            ops.fp_dequantize(deq, dict(out))
        y = ops.fp_dequantize(deq, {**out, "global_scale": amax.reshape(1)})["out"]
        self.assertLess(float(mx.max(mx.abs(y - x))), 0.5)


class Rope(unittest.TestCase):
    LINE = "rope B=2 H=3 T={T} D=16 dtype=f32 dims={dims} traditional={trad} base=10000 scale={scale} offset={off} per_row={pr}"

    def test_position_zero_is_identity(self):
        x = mx.array(np.random.default_rng(0).standard_normal((2, 3, 1, 16)).astype(np.float32))
        for trad in (0, 1):
            p = Problem(self.LINE.format(T=1, dims=16, trad=trad, scale=1, off=0, pr=0) + " seed=1")
            self.assertEqual(np.array(ops.rope(p, {"x": x})["out"]).tolist(), np.array(x).tolist())

    def test_per_row_offsets_and_passthrough(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal((2, 3, 5, 16)).astype(np.float32)
        offsets = np.array([3, -4], dtype=np.int32)
        for trad in (0, 1):
            p = Problem(self.LINE.format(T=5, dims=8, trad=trad, scale=0.5, off=3, pr=1) + " seed=1")
            got = np.array(ops.rope(p, {"x": mx.array(x), "offsets": mx.array(offsets)})["out"])
            inv = 10000.0 ** (-np.arange(4) * 2 / 8)
            theta = ((np.arange(5)[None, :] + offsets[:, None]) * 0.5)[:, None, :, None] * inv
            x1, x2 = (x[..., 0:8:2], x[..., 1:8:2]) if trad else (x[..., :4], x[..., 4:8])
            r1, r2 = x1 * np.cos(theta) - x2 * np.sin(theta), x1 * np.sin(theta) + x2 * np.cos(theta)
            want = x.astype(np.float64).copy()
            if trad:
                want[..., 0:8:2], want[..., 1:8:2] = r1, r2
            else:
                want[..., :4], want[..., 4:8] = r1, r2
            np.testing.assert_allclose(got, want, atol=1e-5)
            self.assertEqual(got[..., 8:].tobytes(), x[..., 8:].tobytes())  # passthrough copied

    def test_freqs_are_wavelengths(self):
        x = mx.array(np.random.default_rng(2).standard_normal((1, 1, 3, 8)).astype(np.float32))
        p = Problem("rope B=1 H=1 T=3 D=8 dtype=f32 dims=8 traditional=0 base=10000 scale=1 offset=2 per_row=0 "
                    "freqs=ramp seed=1")
        got = np.array(ops.rope(p, {"x": x})["out"])
        theta = (np.arange(3) + 2)[:, None] / np.array([1, 38, 75, 112], dtype=np.float64)
        xn = np.array(x)[0, 0]
        want = np.concatenate([xn[:, :4] * np.cos(theta) - xn[:, 4:] * np.sin(theta),
                               xn[:, :4] * np.sin(theta) + xn[:, 4:] * np.cos(theta)], axis=-1)
        np.testing.assert_allclose(got[0, 0], want, atol=1e-5)


class Attention(unittest.TestCase):
    def rand(self, *shape, seed=0):
        return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)

    def test_one_key_returns_its_value(self):
        q, k, v = self.rand(1, 2, 3, 4), self.rand(1, 2, 1, 4), self.rand(1, 2, 1, 6)
        p = attn_line(Hq=2, Hkv=2, Lq=3, Lk=1, Dv=6)
        out = np.array(ops.sdpa(p, {"q": mx.array(q), "k": mx.array(k), "v": mx.array(v)})["out"])
        np.testing.assert_allclose(out, np.broadcast_to(v, (1, 2, 3, 6)), rtol=1e-6)

    def test_gqa_bool_mask_sinks(self):
        q, k, v = self.rand(2, 4, 3, 8), self.rand(2, 2, 5, 8), self.rand(2, 2, 5, 8, seed=1)
        mask = (np.random.default_rng(5).random((2, 4, 3, 5)) < 0.7).astype(np.uint8)
        mask[..., 0] = 1  # no fully masked row
        sinks = np.array([0.5, -1, 2, 0], dtype=np.float32)
        p = attn_line(B=2, Hq=4, Hkv=2, Lq=3, Lk=5, Dk=8, Dv=8, mask="bool", md="BH", sinks=1, scale=0.3)
        out = ops.sdpa(p, {"q": mx.array(q), "k": mx.array(k), "v": mx.array(v), "mask": mx.array(mask),
                           "sinks": mx.array(sinks)})["out"]
        np.testing.assert_allclose(np.array(out), attention_numpy(q, k, v, 0.3, mask != 0, sinks), atol=2e-6)

    def test_causal_window_and_paddings(self):
        B, Lq, Lk = 3, 4, 9
        q, k, v = self.rand(B, 2, Lq, 8), self.rand(B, 1, Lk, 8), self.rand(B, 1, Lk, 8, seed=2)
        p = attn_line(B=B, Hq=2, Hkv=1, Lq=Lq, Lk=Lk, Dk=8, Dv=8, mask="causal", window=3, lpad=2, rpad=1,
                      fm="mean_of_values")
        out = np.array(ops.sdpa(p, {"q": mx.array(q), "k": mx.array(k), "v": mx.array(v)})["out"])
        # kvlab's rule (reference/mask.h), written out: paddings ⌊pad·b/(B−1)⌋, lower right.
        i, j = np.arange(Lq)[:, None] + Lk - Lq, np.arange(Lk)[None, :]
        vis = np.stack([(i >= j) & (i < j + 3) & (j >= 2 * b // 2) & (j < Lk - b // 2) for b in range(B)])[:, None]
        np.testing.assert_allclose(out, attention_numpy(q, k, v, 1 / math.sqrt(8), vis), atol=2e-6)

    def test_default_scale_is_inverse_sqrt_dk(self):
        q, k, v = self.rand(1, 1, 2, 16), self.rand(1, 1, 3, 16), self.rand(1, 1, 3, 4)
        out = ops.sdpa(attn_line(Lq=2, Lk=3, Dk=16), {"q": mx.array(q), "k": mx.array(k), "v": mx.array(v)})["out"]
        np.testing.assert_allclose(np.array(out), attention_numpy(q, k, v, 0.25), atol=2e-6)

    def test_not_expressible(self):
        z = {"q": mx.zeros((1, 1, 3, 4)), "k": mx.zeros((1, 1, 2, 4)), "v": mx.zeros((1, 1, 2, 4))}
        cases = [attn_line(softcap=30),
                 attn_line(Lq=3, Lk=2, mask="causal"),                 # Lq > Lk: row 0 sees no key
                 attn_line(Lq=3, Lk=2, mask="causal", window=1)]       # key 0 hidden from every query
        for p in cases:
            with self.subTest(line=p.line), self.assertRaises(ops.Unsupported):
                ops.sdpa(p, z)
        f16 = {n: a.astype(mx.float16) for n, a in z.items()}
        with self.assertRaises(ops.Unsupported):  # kvlab's f32 sinks do not promote to f16
            ops.sdpa(Problem(attn_line(Lq=3, Lk=2, sinks=1).line.replace("dtype=f32", "dtype=f16")),
                     {**f16, "sinks": mx.zeros((1,))})
        # mean_of_values is MLX's CPU policy: computed, the fully masked row is the mean of V.
        v = mx.array([[[[1.0, 2, 3, 4], [3, 2, 1, 0]]]])
        out = ops.sdpa(attn_line(Lq=3, Lk=2, mask="causal", fm="mean_of_values"), {**z, "v": v})["out"]
        self.assertEqual(np.array(out)[0, 0, 0].tolist(), [2, 2, 2, 2])


class QuantizedAttention(unittest.TestCase):
    EXTRA = "kmode={km} kbits={kb} kgroup=32 vmode={vm} vbits={vb} vgroup=32 kdtype=q vdtype=q"

    def quantized(self, x, bits):
        wq, s, b = mx.quantize(mx.array(x), group_size=32, bits=bits)
        return wq, s, b

    def test_against_numpy_over_the_codes(self):
        rng = np.random.default_rng(7)
        q = rng.standard_normal((1, 4, 2, 32)).astype(np.float32)
        kx, vx = rng.standard_normal((2, 1, 2, 6, 32)).astype(np.float32)
        k, v = self.quantized(kx, 8), self.quantized(vx, 8)
        p = attn_line("quantized_sdpa", self.EXTRA.format(km="affine", kb=8, vm="affine", vb=8),
                      Hq=4, Hkv=2, Lq=2, Lk=6, Dk=32, Dv=32, mask="causal")
        inp = {"q": mx.array(q)}
        for s, (wq, sc, bi) in (("k", k), ("v", v)):
            inp.update({s + "wq": wq, s + "scales": sc, s + "biases": bi})
        out = np.array(ops.quantized_sdpa(p, inp)["out"])

        def deq(wq, sc, bi):  # codes·scale + bias, from the bits, in numpy
            return unpack(np.array(wq), 8, 32) * np.array(sc).astype(np.float64) + np.array(bi).astype(np.float64)
        vis = (np.arange(2)[:, None] + 4) >= np.arange(6)[None, :]
        np.testing.assert_allclose(out, attention_numpy(q, deq(*k), deq(*v), 1 / math.sqrt(32), vis), atol=1e-5)

    def test_not_expressible(self):
        for extra, kw in ((self.EXTRA.format(km="affine", kb=4, vm="affine", vb=8), {}),
                          (self.EXTRA.format(km="mxfp4", kb=4, vm="affine", vb=4), {}),
                          (self.EXTRA.format(km="affine", kb=4, vm="affine", vb=4), {"sinks": 1}),
                          (self.EXTRA.format(km="affine", kb=4, vm="affine", vb=4), {"softcap": 5})):
            p = attn_line("quantized_sdpa", extra, **kw)
            with self.subTest(line=p.line), self.assertRaises(ops.Unsupported):
                ops.quantized_sdpa(p, {})


class Runner(unittest.TestCase):
    META = {"engine": "kvlab", "engine_version": "0", "flavour": "reference", "writer": "test"}

    def test_recompute(self):
        x = np.random.default_rng(4).standard_normal((1, 1, 2, 32)).astype(np.float32)
        zeros = lambda tag, shape: V.Tensor(tag, np.zeros(shape, dtype=V.DTYPES[tag]))  # noqa: E731
        quant = "B=1 H=1 T=2 D=32 dtype=f32 bits=4 group=32 rounding={} dist=normal seed=1"
        good = V.Problem("affine_quantize " + quant.format("mlx"), {"x": V.Tensor("F32", x)},
                         {"wq": zeros("U32", (1, 1, 2, 4)), "scales": zeros("F32", (1, 1, 2, 1)),
                          "biases": zeros("F32", (1, 1, 2, 1))})
        gpu = V.Problem("affine_quantize " + quant.format("mlx_gpu"), good.inputs, good.outputs)
        other = V.Problem("kv_roll B=2 seed=1", {}, {})
        wrong = V.Problem("affine_quantize " + quant.format("mlx"), good.inputs,
                          {**good.outputs, "wq": zeros("U32", (1, 1, 2, 5))})
        # an f16 slot where MLX gives f32 scales: written as f16 and reported as a cast
        cast = V.Problem("affine_quantize " + quant.format("mlx"), good.inputs,
                         {**good.outputs, "scales": zeros("F16", (1, 1, 2, 1))})
        src = V.Vectors(dict(self.META), [gpu, good, other, wrong, cast])
        out, report = recompute(V.parse(V.serialize(src)))
        self.assertEqual([p.line for p in out.problems], [good.line, cast.line])
        self.assertEqual(sum(report.skipped.values()), 2)
        self.assertEqual(sum(report.failed.values()), 1)
        self.assertEqual(list(report.casts), [("affine_quantize", "scales", "float32", "F16")])
        self.assertEqual((out.metadata["engine"], out.metadata["engine_version"], out.metadata["flavour"]),
                         ("mlx", mx.__version__, "mlx"))
        back = V.parse(V.serialize(out))
        self.assertEqual(back.metadata["problem.0"], good.line)
        self.assertEqual(back.problems[0].inputs["x"].array.tobytes(), x.tobytes())  # kvlab's inputs kept
        want = mx.quantize(mx.array(x), group_size=32, bits=4)
        self.assertEqual(back.problems[0].outputs["wq"].array.tolist(), np.array(want[0]).tolist())
        _, only = recompute(src, only_ops={"kv_roll"})
        self.assertEqual(only.filtered, 4)


if __name__ == "__main__":
    unittest.main()
