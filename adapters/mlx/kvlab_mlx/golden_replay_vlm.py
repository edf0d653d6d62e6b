"""Goldens of mlx-vlm: golden/README.md's single-request and batch scenarios through
mlx-vlm's own language models, caches, generate loop and BatchGenerator.

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

Batch scenarios run on mlx-vlm's BatchGenerator (_replay_batch), as golden_replay does on
mlx-lm's; save_at=K as golden_replay's, the caches going through mlx-vlm's state /
meta_state / from_state (_round_trip: mlx-vlm has no prompt-cache file of its own); prefix
over mlx-vlm's prefix_cache_snapshot / restore and trim (_reuse: the store is the
adapter's, as mlx-vlm's own one, APC, is not driven). A kind in NOT_REPLAYED (none now)
would get a marker
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
NOT_REPLAYED: dict[str, str] = {}  # none left; a kind added to the scenarios starts here


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
    err = gr.drain(gen, yielded)
    n, fed = rec.take(seq, steps + 1)
    assert fed[: len(yielded)] == yielded, "yields differ from the tokens the sampler fed"
    return n, fed, err


def _round_trip(cache, tmp):
    """mlx-vlm has no prompt-cache file of its own: its persistence API is each cache's
    `state` / `meta_state` and the class's `from_state`. The states go through a
    safetensors file (MLX's writer and reader, as mlx-lm's save_prompt_cache uses them)
    and come back through mlx-vlm's from_state."""
    import json
    import os

    from mlx.utils import tree_flatten, tree_unflatten

    path = os.path.join(tmp, "cache.safetensors")
    arrays = dict(tree_flatten([c.state for c in cache]))
    meta = {"classes": json.dumps([type(c).__name__ for c in cache]),
            "meta_states": json.dumps([c.meta_state for c in cache])}
    gr.mx.save_safetensors(path, arrays, metadata=meta)
    arrays, meta = gr.mx.load(path, return_metadata=True)
    states = tree_unflatten(list(arrays.items()))
    return [type(c).from_state(st, tuple(ms)) for c, st, ms in zip(cache, states, json.loads(meta["meta_states"]))]


def _replay_batch(ar, utils, model, sc, prompts, layers):
    """As golden_replay._replay_batch, on mlx-vlm's BatchGenerator driven as its own
    batch_generate drives it: the language model, a processor holding the stopping
    criteria (no EOS: every request runs to its max_tokens), and per request the prompt's
    `inputs_embeds` from model.get_input_embeddings; per-request logits processors
    record the raw logits (BatchGenerator calls them per row, before sampling)."""
    import types

    lm = model.language_model
    seqs = [gr.Sequence(p, attn=None) for p in prompts]
    raw = [[] for _ in seqs]

    def processor(i):
        def record(tokens, logits):
            raw[i].append(logits[0])
            return logits
        return record

    def embeds(i):
        return {"inputs_embeds": model.get_input_embeddings(gr.mx.array([prompts[i]])).inputs_embeds}

    quant = dict(kv_bits=sc.kv_bits, kv_group_size=sc.kv_group_size, quantized_kv_start=sc.quantized_kv_start)
    gen = ar.BatchGenerator(lm, types.SimpleNamespace(stopping_criteria=utils.StoppingCriteria([], None)),
                            max_tokens=sc.steps, **quant)

    def insert(indices):
        return gen.insert([prompts[i] for i in indices], max_tokens=[sc.steps] * len(indices),
                          prompt_kwargs=[embeds(i) for i in indices],
                          logits_processors=[[processor(i)] for i in indices])

    def stalled(responses, live, joined):
        if not gen.has_work and (live or not joined):
            raise RuntimeError("mlx-vlm's BatchGenerator ran out of work before every request finished")

    gr.drive_batch(sc, seqs, insert, gen.next, gen.remove, stalled)
    for s, logits in zip(seqs, raw):
        s.logits = logits[: len(s.tokens)]  # a call after the last token is not a step
    gr.mx.eval([s.logits for s in seqs])
    # The classes BatchGenerator builds for these requests (its _make_cache).
    classes = [type(c).__name__ for c in ar._make_cache(lm, [0], **quant)]
    return seqs, classes + ["shared"] * (layers - len(classes))


def _reuse(lm, snapshot, held: list[int], prompt: list[int]):
    """The scenario's prefix rule (golden/README.md "Prefix") over mlx-vlm's own cache API:
    mlx-vlm's only prefix store is APC (apc.py), which this adapter does not drive, so the
    entry is request 0's caches as `prefix_cache_snapshot` took them. They are restored into
    fresh caches (`prefix_cache_restore`) and trimmed to the common prefix when every layer
    `is_trimmable`; else nothing is reused. Returns (caches, tokens reused)."""
    common = 0
    while common < min(len(held), len(prompt) - 1) and held[common] == prompt[common]:
        common += 1  # at least one prompt token is left to process
    cache = lm.make_cache()
    if common > 0:
        for c, snap in zip(cache, snapshot):
            c.prefix_cache_restore(snap)
        if all(c.is_trimmable() for c in cache):
            for c in cache:
                c.trim(c.offset - common)
            return cache, common
    return lm.make_cache(), 0


class VlmReplayer(gr.Replayer):
    """gr.Replayer's metadata and writer, mlx-vlm's loader and generate loop."""

    engine = "mlx-vlm"

    def __init__(self, model_dir, model_id: str | None = None):
        self.ar, utils, self.engine_version = _load_mlx_vlm()
        self.utils = utils
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
        if sc.kind == "batch":
            # batch_cache=device as for mlx-lm: mlx-vlm's BatchKVCache already keeps its
            # offsets as mx.arrays on the device.
            seqs, classes = _replay_batch(self.ar, self.utils, self.model, sc, prompts, self.layers)
            return gr.Result(sc, seqs, classes, time.perf_counter() - t0)
        if sc.kind == "prefix":
            return self._replay_prefix(sc, prompts, t0)
        if sc.kind not in ("single", "save_load"):
            raise ValueError(f"scenario kind {sc.kind} is not replayed through mlx-vlm")
        seq = gr.Sequence(prompts[0])
        from mlx_vlm.models import cache as vlm_cache
        cache = vlm_cache.make_prompt_cache(self.model.language_model, max_kv_size=sc.max_kv_size)
        step = self.ar.generate_step
        with gr.Taps(self.model) as taps:
            self._widths = taps.widths
            if sc.kind == "single":
                _, _, err = _generate(step, self.model, taps, seq, prompts[0], sc.steps, sc, cache)
            else:  # save_load, as golden_replay._replay_save_load with mlx-vlm's from_state
                k = sc.save_at
                n, fed, err = _generate(step, self.model, taps, seq, prompts[0], k, sc, cache)
                if err is None:
                    assert n == k + 1, (n, k)
                    assert all(c.offset == len(prompts[0]) + k for c in cache), [c.offset for c in cache]
                    import tempfile
                    try:
                        with tempfile.TemporaryDirectory(prefix="kvlab-golden-vlm-") as tmp:
                            cache = _round_trip(cache, tmp)
                    except Exception as e:  # mlx-vlm cannot restore these caches: steps 0..K stand
                        err = e
                if err is None:
                    # token K is the continuation's prompt: its first call gives token K+1
                    _, _, err = _generate(step, self.model, taps, seq, [fed[k]], sc.steps - k - 1, sc, cache)
        gr._finish(seq, sc.steps, err)
        return gr.Result(sc, [seq], gr._classes(cache, self.layers), time.perf_counter() - t0)


    def _replay_prefix(self, sc, prompts, t0):
        from mlx_vlm.models import cache as vlm_cache
        lm, step = self.model.language_model, self.ar.generate_step
        first, second = gr.Sequence(prompts[0]), gr.Sequence(prompts[1])
        cache0 = vlm_cache.make_prompt_cache(lm, max_kv_size=sc.max_kv_size)
        with gr.Taps(self.model) as taps:
            self._widths = taps.widths
            _, fed0, err0 = _generate(step, self.model, taps, first, prompts[0], sc.steps, sc, cache0)
            gr._finish(first, sc.steps, err0)
            held = prompts[0] + fed0[: sc.steps]  # the look-ahead call fed the last token too
            if err0 is None:
                assert all(c.offset == len(held) for c in cache0), ([c.offset for c in cache0], len(held))
                cache1, second.reused = _reuse(lm, [c.prefix_cache_snapshot() for c in cache0], held, prompts[1])
            else:
                cache1, second.reused = lm.make_cache(), 0
            _, _, err1 = _generate(step, self.model, taps, second, prompts[1][second.reused:], sc.steps, sc, cache1)
            gr._finish(second, sc.steps, err1)
        return gr.Result(sc, [first, second], gr._classes(cache1, self.layers), time.perf_counter() - t0)


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
