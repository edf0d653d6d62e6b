"""The vectors format: round trips and every defect the reader must refuse."""

import json
import struct
import unittest

import numpy as np

from kvlab_mlx import vectors as V

META = {"kvlab.vectors": "1", "engine": "kvlab", "engine_version": "0", "flavour": "reference", "writer": "test"}


def raw_file(header: dict, data: bytes, meta=None, pad=True) -> bytes:
    """A file from a hand-written header (no checks: the point is to write bad ones)."""
    h = dict(header)
    if meta is not False:
        h["__metadata__"] = meta if meta is not None else {**META, "problems": "1", "problem.0": "rope B=1"}
    text = json.dumps(h).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def sample():
    bf16_bits = np.array([[0x3F80, 0xBF80, 0x7FC0], [0x0001, 0x7F80, 0x0000]], dtype=np.uint16)  # 1, -1, NaN, ...
    p0 = V.Problem("affine_quantize B=1 seed=1",
                   {"x": V.Tensor("BF16", bf16_bits)},
                   {"wq": V.Tensor("U32", np.array([[0xFFFFFFFF, 1]], dtype=np.uint32)),
                    "scales": V.Tensor("F16", np.array([[0.5]], dtype=np.float16))})
    p1 = V.Problem("rope B=2 seed=3",
                   {"x": V.Tensor("F32", np.arange(6, dtype=np.float32).reshape(1, 2, 3)),
                    "offsets": V.Tensor("I32", np.array([-5, 2**31 - 1], dtype=np.int32)),
                    "mask": V.Tensor("U8", np.array([0, 1, 255], dtype=np.uint8)),
                    "empty": V.Tensor("F32", np.zeros((0, 4), dtype=np.float32))},
                   {"out": V.Tensor("F32", np.ones((1, 2, 3), dtype=np.float32))})
    return V.Vectors(dict(META), [p0, p1])


class RoundTrip(unittest.TestCase):
    def test_round_trip_every_dtype(self):
        v = sample()
        blob = V.serialize(v)
        (n,) = struct.unpack("<Q", blob[:8])
        self.assertEqual((8 + n) % 8, 0, "data must start 8-aligned")
        back = V.parse(blob)
        self.assertEqual(back.metadata["problems"], "2")
        self.assertEqual(back.metadata["problem.1"], "rope B=2 seed=3")
        self.assertEqual(back.metadata["engine"], "kvlab")
        for a, b in zip(v.problems, back.problems):
            self.assertEqual(a.line, b.line)
            for side in ("inputs", "outputs"):
                sa, sb = getattr(a, side), getattr(b, side)
                self.assertEqual(list(sa), list(sb))  # order kept
                for name in sa:
                    self.assertEqual(sa[name].dtype, sb[name].dtype)
                    self.assertEqual(sa[name].array.shape, sb[name].array.shape)
                    self.assertEqual(sa[name].array.tobytes(), sb[name].array.tobytes(), name)
        self.assertEqual(V.serialize(back), blob)

    def test_header_is_standard_safetensors(self):
        blob = V.serialize(sample())
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        self.assertEqual(header["0.in.x"], {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]})
        self.assertEqual(header["0.out.wq"]["data_offsets"], [12, 20])

    def test_bf16_to_mlx_and_back_keeps_bits(self):
        import mlx.core as mx
        t = V.Tensor("BF16", np.array([0x3F80, 0xC040, 0x7F80, 0x0001], dtype=np.uint16))
        a = V.to_mlx(t)
        self.assertEqual(a.dtype, mx.bfloat16)
        self.assertEqual(a.astype(mx.float32).tolist()[:3], [1.0, -3.0, float("inf")])
        self.assertEqual(V.from_mlx(a).array.tolist(), t.array.tolist())
        u = V.from_mlx(mx.array([7, 1 << 31], dtype=mx.uint32))
        self.assertEqual((u.dtype, u.array.tolist()), ("U32", [7, 1 << 31]))

    def test_tensor_checks_its_dtype(self):
        with self.assertRaises(ValueError):
            V.Tensor("BF16", np.zeros(2, dtype=np.float32))
        with self.assertRaises(ValueError):
            V.Tensor("F64", np.zeros(2, dtype=np.float64))


class Strictness(unittest.TestCase):
    def assertRejects(self, blob, words):
        with self.assertRaises(ValueError) as cm:
            V.parse(blob, "f")
        self.assertIn(words, str(cm.exception))

    def test_truncated(self):
        blob = V.serialize(sample())
        self.assertRejects(blob[:-1], "truncated")
        self.assertRejects(blob[:5], "truncated")

    def test_bad_header_length(self):
        blob = V.serialize(sample())
        self.assertRejects(struct.pack("<Q", len(blob)) + blob[8:], "truncated")
        self.assertRejects(struct.pack("<Q", 0) + blob[8:], "bad header length")
        self.assertRejects(struct.pack("<Q", 1 << 60) + blob[8:], "bad header length")

    def test_header_not_json(self):
        self.assertRejects(struct.pack("<Q", 4) + b"{]{]", "not valid JSON")

    def test_overlap(self):
        h = {"0.in.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "0.in.b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
        self.assertRejects(raw_file(h, bytes(12)), "overlaps")

    def test_hole(self):
        h = {"0.in.a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
             "0.in.b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}
        self.assertRejects(raw_file(h, bytes(12)), "hole")
        h = {"0.in.a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
        self.assertRejects(raw_file(h, bytes(8)), "hole")  # trailing bytes nobody owns

    def test_data_shorter_than_tensors(self):
        h = {"0.in.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
        self.assertRejects(raw_file(h, bytes(4)), "truncated")

    def test_unknown_dtype(self):
        h = {"0.in.a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}
        self.assertRejects(raw_file(h, bytes(8)), "unknown dtype")

    def test_size_disagrees_with_shape(self):
        h = {"0.in.a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
        self.assertRejects(raw_file(h, bytes(8)), "needs 12")

    def test_missing_metadata(self):
        h = {"0.in.a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
        self.assertRejects(raw_file(h, bytes(1), meta=False), "missing __metadata__")
        full = {**META, "problems": "1", "problem.0": "rope"}
        for key in ("kvlab.vectors", "engine", "engine_version", "flavour", "writer", "problems"):
            meta = {k: v for k, v in full.items() if k != key}
            self.assertRejects(raw_file(h, bytes(1), meta=meta), f"missing metadata '{key}'")
        self.assertRejects(raw_file(h, bytes(1), meta={**META, "problems": "2", "problem.0": "rope"}),
                           "missing metadata 'problem.1'")

    def test_bad_metadata_values(self):
        h = {}
        self.assertRejects(raw_file(h, b"", meta={**META, "problems": "01"}), "decimal")
        self.assertRejects(raw_file(h, b"", meta={**META, "problems": "0", "kvlab.vectors": "2"}), "kvlab.vectors")
        self.assertRejects(raw_file(h, b"", meta={**META, "problems": 0}), "not a string")
        self.assertRejects(raw_file(h, b"", meta={**META, "problems": "0", "problem.0": "x"}), "names no problem")

    def test_bad_tensor_names(self):
        for name in ("x", "0.inout.x", "1.in.x", "00.in.x", "0.in."):
            h = {name: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
            with self.subTest(name=name):
                self.assertRejects(raw_file(h, bytes(1)), "tensor")

    def test_duplicate_key(self):
        text = (b'{"__metadata__":{"kvlab.vectors":"1","engine":"e","engine_version":"0","flavour":"f",'
                b'"writer":"w","problems":"0","problems":"0"}}')
        self.assertRejects(struct.pack("<Q", len(text)) + text, "duplicate")

    def test_writer_requires_metadata(self):
        v = sample()
        del v.metadata["engine"]
        with self.assertRaises(ValueError):
            V.serialize(v)


if __name__ == "__main__":
    unittest.main()
