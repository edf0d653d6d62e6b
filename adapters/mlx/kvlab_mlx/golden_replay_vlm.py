"""Goldens of mlx-vlm: golden/README.md's single-request scenarios through mlx-vlm's own
language models, caches and generate loop.

`python -m kvlab_mlx golden-vlm --model DIR --scenarios FILE --out OUTDIR` loads DIR with
`mlx_vlm.utils.load_model` (the folder as kvlab writes it: no mapping; `model_type`
`llama` and `gemma4_text` pick mlx-vlm's own `models/llama` and `models/gemma4_text`,
whose `sanitize` puts the weights under `language_model.`) and writes
OUTDIR/<model id>.<scenario>.mlx-vlm.safetensors with golden_replay.py's writer.

What runs: `mlx_vlm.generate.ar.generate_step` (greedy sampler, a recording logits
processor; kv_bits, kv_group_size, quantized_kv_start and max_kv_size passed through), so
the caches are mlx-vlm's (`mlx_vlm.models.cache` via the model's `make_cache`) and the
kv_bits route is its `maybe_quantize_kv_cache` (uniform scheme: `to_quantized` on every
layer whose offset reached the start). The steps are matched to model calls exactly as
for mlx-lm (golden_replay._Steps): mlx-vlm's generate_step has the same pipelining (one
look-ahead call) and calls the processors after the model and before quantizing.

Not replayed (NOT_REPLAYED): the batch, prefix and save/load scenarios; for each, a marker
OUTDIR/<model id>.<scenario>.mlx-vlm.not-replayed holds the reason, which
tools/golden_table.py prints as the row's status.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

from . import golden_replay as gr
from .engines import _subpackages

# Scenario kinds this adapter does not drive, and why (printed as the table's status).
NOT_REPLAYED = {
    "batch": "mlx-vlm's BatchGenerator (generate/ar.py) is not driven by this adapter yet",
    "prefix": "mlx-vlm has no LRUPromptCache; its prefix store (apc.py) is not driven yet",
    "save_load": "mlx-vlm 0.7.10's cache module has no save_prompt_cache / load_prompt_cache",
}


def _load_mlx_vlm():
    """mlx-vlm's generate loop without its package __init__ (which imports opencv and
    more). mlx_vlm.utils imports `requests` for image URLs only; the pinned venv installs
    mlx-vlm without dependencies, so a stub stands in for it."""
    _subpackages("mlx_vlm", "mlx-vlm (tools/setup_venv.sh)", "mlx_vlm.models")
    sys.modules.setdefault("requests", types.ModuleType("requests"))
    from mlx_vlm.generate import ar
    from mlx_vlm import utils
    from mlx_vlm import version
    return ar, utils, version.__version__


def _generate(gen_step, model, taps, seq, prompt, steps, sc, cache):
    rec = gr._Steps(taps)
    yielded = []
    gen = gen_step(gr.mx.array([prompt]), model, None, None, max_tokens=steps, sampler=rec.sampler,
                   logits_processors=[rec.processor], max_kv_size=sc.max_kv_size, prompt_cache=cache,
                   kv_bits=sc.kv_bits, kv_group_size=sc.kv_group_size, quantized_kv_start=sc.quantized_kv_start)
    err = None
    try:
        for y, _ in gen:
            yielded.append(int(y))
    except Exception as e:  # mlx-vlm's own raise: recorded, never fatal
        err = e
    finally:
        gen.close()
    _, fed = rec.take(seq, steps + 1)
    assert fed[: len(yielded)] == yielded, "yields differ from the tokens the sampler fed"
    return err


class VlmReplayer(gr.Replayer):
    """gr.Replayer's metadata and writer, mlx-vlm's loader and generate loop."""

    engine = "mlx-vlm"

    def __init__(self, model_dir, model_id: str | None = None):
        self.ar, utils, self.engine_version = _load_mlx_vlm()
        self.dir = Path(model_dir)
        self.model = utils.load_model(self.dir)
        self.config = self.model.config
        self.model_id = model_id or self.dir.name
        self.vocab = int(self.model.config.vocab_size)
        self.layers = len(self.model.layers)
        self.sha256 = gr.sha256_file(self.dir / "model.safetensors")

    def replay(self, sc, teacher=None):
        assert teacher is None, "the mlx-vlm replay takes no teacher"
        t0 = time.perf_counter()
        prompts = sc.request_prompts(self.vocab)
        if sc.kind != "single":
            raise ValueError(f"scenario kind {sc.kind} is not replayed through mlx-vlm")
        seq = gr.Sequence(prompts[0])
        from mlx_vlm.models import cache as vlm_cache
        cache = vlm_cache.make_prompt_cache(self.model.language_model, max_kv_size=sc.max_kv_size)
        with gr.Taps(self.model) as taps:
            self._widths = taps.widths
            err = _generate(self.ar.generate_step, self.model, taps, seq, prompts[0], sc.steps, sc, cache)
        gr._finish(seq, sc.steps, err)
        return gr.Result(sc, [seq], gr._classes(cache, self.layers), time.perf_counter() - t0)


def main(model_dir, scenarios_path, out_dir, model_id=None) -> int:
    gr.require_regular_file(scenarios_path, "scenario file")
    scenarios = gr.read_scenarios(scenarios_path)
    model_id = model_id or Path(scenarios_path).name
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    rp = VlmReplayer(model_dir, model_id)
    for sc in scenarios:
        if sc.kind in NOT_REPLAYED:
            print(f"{sc.name}: not replayed ({NOT_REPLAYED[sc.kind]})", flush=True)
            # the marker tools/golden_table.py turns into a "not replayed" row
            (Path(out_dir) / f"{model_id}.{sc.name}.{rp.engine}.not-replayed").write_text(NOT_REPLAYED[sc.kind] + "\n")
            continue
        r = rp.replay(sc)
        rp.write(r, out_dir)
        print(gr.summary(r), flush=True)
    return 0
