#!/usr/bin/env python3
"""Test vectors for kvlab's ggml block oracle from gguf-py's numpy reference.

Runs in the pinned venv of tools/ggml/requirements.txt (tools/ggml/setup_venv.sh) and
writes one line per block (read by tests/unit/test_ggml_gguf_vectors.cc):

  <mode> q <32 input f32, hex bits> <gguf-py's block bytes, hex> <its 32 dequantized f32>
  <mode> d <block bytes, hex> <gguf-py's 32 dequantized f32>

`q` lines: gguf-py quantized the input (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 have quantizers).
`d` lines: random blocks with finite f16 scales, dequantized by gguf-py (all six formats;
gguf-py has no IQ4_NL quantizer). Inputs are deterministic (numpy's PCG64, fixed seed).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_modules import gguf_modules  # noqa: E402


def load_quants():
    """gguf.quants and gguf.constants (tools/ggml/gguf_modules.py)."""
    return gguf_modules("quants", "constants")


QUANTIZERS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
ALL = QUANTIZERS + ["iq4_nl"]


def input_blocks(rng: np.random.Generator) -> np.ndarray:
    """Blocks of 32 f32 chosen to reach every rule: normal data at three spreads, exact
    ties on a k/4 grid, small integers, zero blocks (with −0.0 first), equal-magnitude
    extremes of both signs, f16-subnormal and f16-overflowing scales."""
    parts = [
        rng.standard_normal((1500, 32)),
        rng.standard_normal((200, 32)) * 1e-3,
        rng.standard_normal((200, 32)) * 1e3,
        rng.integers(-16, 17, (400, 32)) / 4.0,
        rng.integers(-8, 9, (200, 32)).astype(np.float64),
        rng.standard_normal((100, 32)) * 1e-6,  # d below f16's normal range
        rng.standard_normal((50, 32)) * 3e5,  # q4_1/q5_1: d above 65504 → inf
        rng.uniform(0.0, 1.0, (100, 32)),  # all positive: q4_1's min > 0
        -rng.uniform(0.0, 1.0, (100, 32)),  # all negative
    ]
    special = np.zeros((6, 32))
    special[1, 0] = -0.0
    special[2, :] = 3.0
    special[3, 0], special[3, 5] = -2.0, 2.0  # |max| tie: the first wins
    special[4, 0], special[4, 5] = 2.0, -2.0
    special[5, :] = np.arange(32) - 16.0
    parts.append(special)
    return np.concatenate(parts).astype(np.float32)


def random_block_bytes(rng: np.random.Generator, size: int, scale_fields: int, n: int) -> np.ndarray:
    """n random blocks whose leading f16 fields (d, and m) are finite."""
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    f16 = raw[:, : 2 * scale_fields].copy().view(np.uint16)
    f16 &= np.uint16(0xBFFF)  # clear the top exponent bit: exponent < 31, so finite
    raw[:, : 2 * scale_fields] = f16.view(np.uint8)
    return raw


def hex_f32(a: np.ndarray) -> str:
    return " ".join(f"{v:08x}" for v in a.astype(np.float32).view(np.uint32))


def main() -> None:
    quants, constants = load_quants()
    out = sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w", encoding="ascii")
    rng = np.random.default_rng(20260545)
    types_ = {m: getattr(constants.GGMLQuantizationType, m.upper()) for m in ALL}
    blocks = input_blocks(rng)
    lines = 0
    with np.errstate(all="ignore"):
        for mode in QUANTIZERS:
            q = quants.quantize(blocks, types_[mode])
            back = quants.dequantize(q, types_[mode])
            for x, b, y in zip(blocks, q, back):
                out.write(f"{mode} q {hex_f32(x)} {b.tobytes().hex()} {hex_f32(y)}\n")
                lines += 1
        for mode in ALL:
            block_size, type_size = constants.GGML_QUANT_SIZES[types_[mode]]
            assert block_size == 32
            fields = 2 if mode in ("q4_1", "q5_1") else 1
            raw = random_block_bytes(rng, type_size, fields, 500)
            back = quants.dequantize(raw, types_[mode])
            for b, y in zip(raw, back.reshape(-1, 32)):
                out.write(f"{mode} d {b.tobytes().hex()} {hex_f32(y)}\n")
                lines += 1
    print(f"gguf_vectors: {lines} blocks", file=sys.stderr)


if __name__ == "__main__":
    main()
