"""kvlab vectors files: a strict reader and writer (safetensors layout, kvlab metadata).

Layout: u64 little-endian header length N, N bytes of JSON, then the data buffer. The
JSON maps each tensor name to {dtype, shape, data_offsets=[begin, end]} (offsets into
the data buffer) and holds "__metadata__", a string-to-string map. kvlab names tensors
"<k>.in.<name>" and "<k>.out.<name>" for problem k and keeps the problem lines in the
metadata. The reader refuses anything it cannot account for byte by byte: a vectors
file is evidence in a judgement, so a silently tolerated hole or overlap could hide a
truncated or corrupted result.

BF16 has no numpy dtype: its payload is kept as raw uint16 bits (see to_mlx/from_mlx).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

import numpy as np

FORMAT_VERSION = "1"

# Storage dtype tag -> the numpy dtype that holds its bytes (little-endian).
DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
}

REQUIRED_METADATA = ("kvlab.vectors", "engine", "engine_version", "flavour", "writer", "problems")

# A header larger than this is not something kvlab writes; refusing it early keeps a
# corrupted length field from turning into a multi-gigabyte allocation.
MAX_HEADER_BYTES = 256 << 20

_NAME = re.compile(r"^(0|[1-9][0-9]*)\.(in|out)\.([A-Za-z0-9_][A-Za-z0-9_.]*)$")  # cache content: "keys.wq"


@dataclass
class Tensor:
    dtype: str          # one of DTYPES
    array: np.ndarray   # shaped; BF16 as uint16 bits

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r} (known: {', '.join(DTYPES)})")
        if self.array.dtype != DTYPES[self.dtype]:
            raise ValueError(f"a {self.dtype} tensor needs numpy {DTYPES[self.dtype]}, not {self.array.dtype}")


@dataclass
class Problem:
    line: str
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class Vectors:
    metadata: dict[str, str]
    problems: list[Problem]


def _fail(path, what):
    raise ValueError(f"{path}: {what}")


def _no_duplicate_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate JSON key {k!r}")
        out[k] = v
    return out


def _is_count(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def parse(blob: bytes, path: str = "<bytes>") -> Vectors:
    """Parses a whole vectors file held in memory; ValueError names the first defect."""
    if len(blob) < 8:
        _fail(path, f"truncated: {len(blob)} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n == 0 or n > MAX_HEADER_BYTES:
        _fail(path, f"bad header length {n}")
    if 8 + n > len(blob):
        _fail(path, f"truncated: header length {n} runs past the end of the {len(blob)}-byte file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:
        _fail(path, f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        _fail(path, "header is not a JSON object")
    data = memoryview(blob)[8 + n:]

    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict):
        _fail(path, "missing __metadata__")
    for k, v in meta.items():
        if not isinstance(v, str):
            _fail(path, f"metadata {k!r} is not a string")
    for k in REQUIRED_METADATA:
        if k not in meta:
            _fail(path, f"missing metadata {k!r}")
    if meta["kvlab.vectors"] != FORMAT_VERSION:
        _fail(path, f"kvlab.vectors is {meta['kvlab.vectors']!r}, this reader knows {FORMAT_VERSION!r}")
    if not re.fullmatch(r"0|[1-9][0-9]*", meta["problems"]):
        _fail(path, f"metadata problems={meta['problems']!r} is not a decimal count")
    count = int(meta["problems"])
    problems = []
    for k in range(count):
        line = meta.get(f"problem.{k}")
        if line is None:
            _fail(path, f"missing metadata 'problem.{k}' (problems={count})")
        problems.append(Problem(line))
    for k in meta:
        m = re.fullmatch(r"problem\.(0|[1-9][0-9]*)", k)
        if k.startswith("problem.") and (m is None or int(m.group(1)) >= count):
            _fail(path, f"metadata {k!r} names no problem (problems={count})")

    spans = []
    for order, (name, entry) in enumerate(header.items()):
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            _fail(path, f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            _fail(path, f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            _fail(path, f"tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
                or offsets[0] > offsets[1]):
            _fail(path, f"tensor {name!r}: bad data_offsets {offsets!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        if offsets[1] - offsets[0] != nbytes:
            _fail(path, f"tensor {name!r}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, "
                        f"{dtype}{shape} needs {nbytes}")
        m = _NAME.match(name)
        if m is None:
            _fail(path, f"tensor {name!r} is not named <k>.in.<name> or <k>.out.<name>")
        k = int(m.group(1))
        if k >= count:
            _fail(path, f"tensor {name!r} names problem {k}, the file has {count}")
        spans.append((offsets[0], offsets[1], name, dtype, shape, k, m.group(2), m.group(3), order))

    # Contiguous cover of the data buffer: sorted by begin (empty tensors first at a
    # tie), each one starts where the previous ended and the last ends at the buffer's end.
    spans.sort(key=lambda s: (s[0], s[1]))
    at = 0
    for begin, end, name, *_ in spans:
        if begin < at:
            _fail(path, f"tensor {name!r} at [{begin}, {end}) overlaps the previous tensor (ends at {at})")
        if begin > at:
            _fail(path, f"hole in the data buffer: bytes [{at}, {begin}) belong to no tensor")
        at = end
    if at != len(data):
        if at > len(data):
            _fail(path, f"truncated: tensors need {at} data bytes, the file holds {len(data)}")
        _fail(path, f"hole in the data buffer: bytes [{at}, {len(data)}) after the last tensor")

    # Back in header order, which is the writer's order (the JSON keeps it).
    for begin, end, name, dtype, shape, k, side, short, _ in sorted(spans, key=lambda s: s[-1]):
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[dtype]).reshape(shape).copy()
        (problems[k].inputs if side == "in" else problems[k].outputs)[short] = Tensor(dtype, arr)
    return Vectors(dict(meta), problems)


def read(path: str) -> Vectors:
    with open(path, "rb") as f:
        return parse(f.read(), path)


def serialize(vectors: Vectors) -> bytes:
    """The file's bytes. Problem lines and the count come from vectors.problems; the
    metadata must hold the other required keys."""
    meta = {k: v for k, v in vectors.metadata.items() if not k.startswith("problem")}
    meta["kvlab.vectors"] = FORMAT_VERSION
    for k in REQUIRED_METADATA:
        if k != "problems" and k not in meta:
            raise ValueError(f"cannot write: missing metadata {k!r}")
    meta["problems"] = str(len(vectors.problems))
    for k, p in enumerate(vectors.problems):
        meta[f"problem.{k}"] = p.line
    for k, v in meta.items():
        if not isinstance(v, str):
            raise ValueError(f"cannot write: metadata {k!r} is not a string")

    header = {"__metadata__": meta}
    chunks, at = [], 0
    for k, p in enumerate(vectors.problems):
        for side, tensors in (("in", p.inputs), ("out", p.outputs)):
            for short, t in tensors.items():
                name = f"{k}.{side}.{short}"
                if not _NAME.match(name):
                    raise ValueError(f"cannot write: bad tensor name {name!r}")
                Tensor(t.dtype, t.array)  # re-validates dtype against the array
                raw = np.ascontiguousarray(t.array).tobytes()
                header[name] = {"dtype": t.dtype, "shape": list(t.array.shape), "data_offsets": [at, at + len(raw)]}
                chunks.append(raw)
                at += len(raw)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # data starts 8-aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write(path: str, vectors: Vectors) -> None:
    blob = serialize(vectors)
    with open(path, "wb") as f:
        f.write(blob)


# ---- MLX conversions (imported lazily so the format itself needs numpy alone) ----

def to_mlx(t: Tensor):
    import mlx.core as mx
    if t.dtype == "BF16":
        return mx.array(t.array).view(mx.bfloat16)
    return mx.array(t.array)


_MX_TAG = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32", "uint8": "U8"}


def mlx_tag(arr) -> str | None:
    """The storage tag of an MLX array's dtype, or None for a dtype the format lacks."""
    return _MX_TAG.get(str(arr.dtype).removeprefix("mlx.core."))


def from_mlx(arr) -> Tensor:
    import mlx.core as mx
    tag = mlx_tag(arr)
    if tag is None:
        raise ValueError(f"MLX dtype {arr.dtype} has no vectors dtype")
    if tag == "BF16":
        return Tensor(tag, np.array(arr.view(mx.uint16)))
    return Tensor(tag, np.array(arr).astype(DTYPES[tag], copy=False))
