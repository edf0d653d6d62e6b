"""Recompute a kvlab vectors file with MLX: kvlab's inputs in, MLX's outputs out.

The output file holds only the problems MLX computed, renumbered from 0, each with
kvlab's inputs unchanged and MLX's outputs under kvlab's slot names. The slots' dtypes
and shapes are those of kvlab's expected outputs in the input file.
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from dataclasses import dataclass, field

import mlx.core as mx

from . import ops as mlx_ops
from .problem import Problem
from .vectors import Problem as VProblem
from .vectors import Vectors, from_mlx, mlx_tag, to_mlx

WRITER = "adapters/mlx kvlab_mlx 1"


@dataclass
class Report:
    computed: Counter = field(default_factory=Counter)   # op -> count
    skipped: Counter = field(default_factory=Counter)    # (op, reason) -> count: MLX cannot express it
    rejected: Counter = field(default_factory=Counter)   # (op, message) -> count: MLX raised on the problem
    failed: Counter = field(default_factory=Counter)     # (op, reason) -> count: an error, not a limitation
    casts: Counter = field(default_factory=Counter)      # (op, slot, mlx dtype, slot dtype) -> count
    filtered: int = 0                                     # left out by --ops
    failed_lines: list = field(default_factory=list)     # (line, reason), the first few
    raised: list = field(default_factory=list)           # (line, message): findings (cache replay)
    skipped_lines: list = field(default_factory=list)    # (line, reason)
    computed_lines: list = field(default_factory=list)

    def lines(self):
        out = [f"computed {sum(self.computed.values())}, skipped {sum(self.skipped.values())}, "
               f"rejected by MLX {sum(self.rejected.values())}, failed {sum(self.failed.values())}" + (f", not selected {self.filtered}" if self.filtered else "")]
        for op, n in sorted(self.computed.items()):
            out.append(f"  computed {op}: {n}")
        for title, counter in (("skipped", self.skipped), ("MLX raised", self.rejected), ("FAILED", self.failed)):
            for (op, reason), n in sorted(counter.items()):
                out.append(f"  {title} {op} ({n}): {reason}")
        for (op, slot, got, want), n in sorted(self.casts.items()):
            out.append(f"  CAST {op}.{slot} ({n}): MLX returned {got}, kvlab's slot is {want}; written as {want} "
                       "(a cast can hide a divergence)")
        for line, reason in self.failed_lines:
            out.append(f"  failed: {line}\n    {reason}")
        return out


def _outputs(op, vp, result, report):
    """MLX's result as vectors tensors shaped and typed like kvlab's slots."""
    slots = vp.outputs
    if not slots:
        raise ValueError("the file has no kvlab output slots for this problem")
    if set(result) != set(slots):
        raise ValueError(f"MLX outputs {sorted(result)} are not kvlab's slots {sorted(slots)}")
    out = {}
    for name, slot in slots.items():
        arr = result[name]
        if tuple(arr.shape) != slot.array.shape and op == "cache":
            # A cache whose content differs in length is a finding about the engine, not an
            # adapter error: say where the bookkeeping first parted.
            raise mlx_ops.EngineRaised(f"content {name}: {_engine_name()} holds {arr.shape[0]} rows, kvlab "
                                       f"{slot.array.shape[0]}; {_first_bookkeeping_difference(result, slots)}")
        if tuple(arr.shape) != slot.array.shape:
            raise ValueError(f"MLX's {name} has shape {tuple(arr.shape)}, kvlab's slot {slot.array.shape}")
        t = from_mlx(arr) if mlx_tag(arr) == slot.dtype else None
        if t is None:
            report.casts[(op, name, str(arr.dtype).removeprefix("mlx.core."), slot.dtype)] += 1
            t = from_mlx(arr.astype(_MX[slot.dtype]))
        out[name] = t
    return out


def _engine_name():
    from . import cache_replay

    return cache_replay.engine().name


def _first_bookkeeping_difference(result, slots):
    """The first command after which offsets or kv_length differ (kvlab's outputs are the file's)."""
    for name in ("kv_length", "offsets"):
        mine, theirs = result[name].tolist(), slots[name].array.tolist()
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                return f"first difference: {name}[{i}] {_engine_name()} {a}, kvlab {b}"
    return "offsets and kv_length agree"


_MX = {"F32": mx.float32, "F16": mx.float16, "BF16": mx.bfloat16, "U32": mx.uint32, "I32": mx.int32, "U8": mx.uint8}


def recompute(vectors: Vectors, only_ops=None, max_failed_lines=5):
    report = Report()
    done, routes = [], set()
    for vp in vectors.problems:
        op = vp.line.split(maxsplit=1)[0] if vp.line.strip() else "?"
        if only_ops and op not in only_ops:
            report.filtered += 1
            continue
        try:
            p = Problem(vp.line)
            if p.op not in mlx_ops.OPS:
                raise mlx_ops.Unsupported("no MLX route for this op in kvlab_mlx")
            fn, route = mlx_ops.OPS[p.op]
            if p.op == "cache":  # the cache classes of the engine chosen by name
                from . import cache_replay

                route = f"{cache_replay.engine().package}.models.cache"
            inputs = {name: to_mlx(t) for name, t in vp.inputs.items()}
            with mx.stream(mlx_ops.DEVICE):
                result = fn(p, inputs)
                mx.eval(list(result.values()))
            outputs = _outputs(op, vp, result, report)
        except mlx_ops.Unsupported as e:
            report.skipped[(op, str(e))] += 1
            report.skipped_lines.append((vp.line, str(e)))
            continue
        except mlx_ops.EngineRaised as e:  # mlx-lm raised on a valid problem: a finding
            report.rejected[(op, str(e).splitlines()[0])] += 1
            report.raised.append((vp.line, str(e).splitlines()[0]))
            continue
        except (ValueError, RuntimeError) as e:
            # MLX's C++ errors read "[op] message": MLX refused a problem kvlab calls valid
            # (e.g. an empty tensor). A finding about MLX, not the adapter's failure.
            if str(e).startswith("["):
                report.rejected[(op, str(e).splitlines()[0])] += 1
                continue
            report.failed[(op, f"{type(e).__name__}: {e}".splitlines()[0])] += 1
            if len(report.failed_lines) < max_failed_lines:
                report.failed_lines.append((vp.line, f"{type(e).__name__}: {e}"))
            continue
        except Exception as e:  # anything else is the adapter's problem: report, go on
            reason = f"{type(e).__name__}: {e}"
            report.failed[(op, reason.splitlines()[0])] += 1
            if len(report.failed_lines) < max_failed_lines:
                report.failed_lines.append((vp.line, reason))
            continue
        report.computed[op] += 1
        report.computed_lines.append(vp.line)
        routes.add(route)
        done.append(VProblem(vp.line, dict(vp.inputs), outputs))
    meta = {
        "kvlab.vectors": "1",
        "engine": "mlx",
        "engine_version": mx.__version__,
        "flavour": flavour(routes),
        "writer": f"{WRITER} ({engine_versions(routes)})",
    }
    return Vectors(meta, done), report


_ENGINE_PACKAGES = {"mlx_lm": "mlx-lm", "mlx_vlm": "mlx-vlm", "vllm_mlx": "vllm-mlx"}


def flavour(routes):
    """mlx for MLX core ops (kvlab's rounding=mlx flavour), mlx_lm / mlx_vlm for an engine's
    functions, joined by '+'."""
    names = sorted({r.split(".")[0] if r.split(".")[0] in _ENGINE_PACKAGES else "mlx" for r in routes}) or ["mlx"]
    return "+".join(names)


def engine_versions(routes):
    """The engine packages the routes used, with their versions (mlx-lm when none did)."""
    used = sorted({r.split(".")[0] for r in routes} & set(_ENGINE_PACKAGES)) or ["mlx_lm"]
    return ", ".join(f"{_ENGINE_PACKAGES[u]} {importlib.metadata.version(_ENGINE_PACKAGES[u])}" for u in used)
