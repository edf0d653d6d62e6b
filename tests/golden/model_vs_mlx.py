"""kvlab's tiny-model forward pass against mlx-lm's own model classes (golden.model_vs_mlx_lm).

Runs the C++ runner (golden_model_vs_mlx_runner), which writes each model directory and
kvlab's record of one request, then loads the same directory with mlx_lm.utils.load_model,
makes caches with model.make_cache(), replays the same calls (prompt[:-1], prompt[-1],
then the greedy tokens), records the last position's logits and every layer's o_proj
input, and compares. Fails unless max |dlogit| <= 1e-4 and the greedy tokens agree.

usage: model_vs_mlx.py --runner EXE --models golden/models --work DIR
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

MAX_DLOGIT = 1e-4
# The README's attn_rel tolerance of a golden diff; reported here, checked loosely.
MAX_ATTN_REL = 1e-4

try:
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx_lm.utils import load_model
    import mlx_lm
except ImportError as e:  # the CTest skips on this line
    print(f"SKIPPED: mlx-lm is not importable here ({e})")
    sys.exit(0)


class Recorder(nn.Module):
    """Wraps o_proj: keeps its input at the last position of every call."""

    def __init__(self, inner, sink):
        super().__init__()
        self.inner = inner
        self._sink = sink

    def __call__(self, x):
        self._sink.append(np.array(x[:, -1, :].astype(mx.float32)))
        return self.inner(x)


def replay(model_dir: Path, prompt, n_calls):
    model, _ = load_model(model_dir)
    sinks = []
    for layer in model.layers:
        sink = []
        layer.self_attn.o_proj = Recorder(layer.self_attn.o_proj, sink)
        sinks.append(sink)
    cache = model.make_cache()
    logits, tokens = [], []

    def call(ids):
        out = model(mx.array([ids]), cache=cache)
        row = np.array(out[0, -1, :].astype(mx.float32))
        logits.append(row)
        return int(np.argmax(row))  # first index of the maximum, as kvlab's greedy

    call(prompt[:-1])
    nxt = prompt[-1]
    for _ in range(n_calls - 1):
        nxt = call([nxt])
        tokens.append(nxt)
    attention = [[s[c][0] for s in sinks] for c in range(n_calls)]
    return logits, tokens, attention


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    subprocess.run([args.runner, args.models, str(work)], check=True)

    print(f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}")
    failures = []
    compared = 0
    for model_dir in sorted(p for p in work.iterdir() if (p / "kvlab.json").exists()):
        rec = json.loads((model_dir / "kvlab.json").read_text())
        n_calls = len(rec["logits"])
        compared += 1
        logits, tokens, attention = replay(model_dir, rec["prompt"], n_calls)
        k_logits = np.array(rec["logits"], dtype=np.float32).reshape(n_calls, -1)
        dlogit = float(np.max(np.abs(k_logits - np.stack(logits))))
        n_layers = len(rec["attention"][0])
        layer_rel = []
        for l in range(n_layers):
            layer_rel.append(max(rel(np.array(attention[c][l]), np.array(rec["attention"][c][l], dtype=np.float32))
                                 for c in range(n_calls)))
        same = tokens == rec["tokens"]
        print(f"{rec['model']}: {n_calls} calls, max |dlogit| {dlogit:.3e}, tokens "
              f"{'identical' if same else 'DIFFER'} {tokens}")
        print("  per-layer max relative delta of the o_proj input: "
              + ", ".join(f"L{l} {r:.2e}" for l, r in enumerate(layer_rel)))
        if dlogit > MAX_DLOGIT:
            failures.append(f"{rec['model']}: max |dlogit| {dlogit:.3e} > {MAX_DLOGIT}")
        if not same:
            failures.append(f"{rec['model']}: greedy tokens differ: kvlab {rec['tokens']} vs mlx-lm {tokens}")
        if max(layer_rel) > MAX_ATTN_REL:
            failures.append(f"{rec['model']}: attention relative delta {max(layer_rel):.3e} > {MAX_ATTN_REL}")
    if compared == 0:
        failures.append("no model was compared")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
