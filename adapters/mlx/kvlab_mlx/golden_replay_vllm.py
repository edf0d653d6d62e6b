"""Goldens of vllm-mlx: golden/README.md's scenarios through vllm-mlx 0.6.0's own
continuous-batching scheduler, in process.

`python -m kvlab_mlx golden-vllm --model DIR --scenarios FILE --out OUTDIR` loads DIR with
mlx-lm 0.31.3's `load_model` (the mlx-lm vllm-mlx's venv pins; the folder as kvlab writes
it) and writes OUTDIR/<model id>.<scenario>.vllm-mlx.safetensors in kvlab's golden format.

What is driven: `vllm_mlx.scheduler.Scheduler` (add_request, step, abort_request), which
owns the request queue, builds mlx-lm 0.31.3's BatchGenerator with its own patches, its
prefix store (MemoryAwarePrefixCache, the default config) and its max_kv_size bound
(`_bound_cache_layers`). The engine core (engine_core.EngineCore) only runs this same
Scheduler.step in an asyncio loop; the scheduler runs alone without a server, so the
engine core adds nothing a replay could observe and is not driven.

Requests carry token ids (no tokenizer: a stub with no EOS, so every request runs to its
max_tokens), temperature 0 (the scheduler's make_sampler: argmax) and a per-request logits
processor (SamplingParams.logits_processors), which BatchGenerator calls on the raw logits
of each row before normalizing: that is the recorded logits row. Single requests also
record each layer's attention output row (golden_replay.Taps on o_proj: the scheduler runs
one row, so every model call is that row's); batches record tokens and logits only, as
golden_replay's BatchGenerator replay does.

Per scenario kind:
  single       one request, max_tokens=steps (max_kv_size: SchedulerConfig.max_kv_size)
  batch        golden_replay.drive_batch over the scheduler: the requests start together,
               finish=R@K is abort_request (the scheduler removes it before its next
               step), join=P@S is add_request after decode round S; batch_cache=device
               runs the same (mlx-lm's BatchKVCache keeps its offsets on the device)
  prefix       request 0 runs to its end; the scheduler stores its cache in its own
               MemoryAwarePrefixCache; request 1 is added after it and the scheduler
               fetches from that store (seq.1.reused: the request's cached_tokens)
  kv_bits      NOT_REPLAYED: vllm-mlx 0.6.0 has no live KV quantization (see NOT_REPLAYED)
  save_at      NOT_REPLAYED: the scheduler has no mid-request save and resume

With --concurrent-out (CONCURRENT_SETTINGS): SwiftLM's "Test 9" as far as vllm-mlx reaches.
It takes no per-request kv_bits, so four concurrent requests of the plain prompt run under
each global kv-cache quantization setting, each row judged against kvlab's plain golden.

The scheduler catches a generation error itself (Scheduler.step: it logs the traceback and
finishes every running request with finish_reason "error"); the replay reads the logged
message and records it as the status `error: <message>` of every request not yet done.

Imports: mlx-lm 0.31.3's package imports transformers and huggingface_hub, which the pinned
venv (--no-deps) does not install; they serve tokenizers and downloads only, so stubs stand
in for them (_load). golden_replay imports mlx-lm 0.32's greedy_sampler, which 0.31.3 lacks;
the same argmax is put there before the import. golden_replay's writer uses the safetensors
package (absent in this venv): _write uses MLX's own safetensors writer, same format.
"""

from __future__ import annotations

import logging
import sys
import time
import types
from pathlib import Path

# Scenario kinds (golden_scenario.Scenario.kind, or a key) this adapter does not drive,
# and why: printed as the table's status through the marker file.
KV_BITS_REASON = ("vllm-mlx 0.6.0 has no live KV-cache quantization: its kv_cache_quantization* settings "
                  "(scheduler.py SchedulerConfig) quantize prefix-cache entries only, and mlx-lm 0.31.3's "
                  "BatchGenerator takes no kv_bits")
SAVE_LOAD_REASON = ("vllm-mlx's scheduler has no mid-request save and resume (save_cache_to_disk persists "
                    "the prefix store only)")


def not_replayed(sc) -> str | None:
    """Why this scenario is not driven through vllm-mlx, or None when it is."""
    if sc.kv_bits is not None:
        return KV_BITS_REASON
    if sc.kind == "save_load":
        return SAVE_LOAD_REASON
    return None


def _stub(name: str, **attrs):
    if name not in sys.modules:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


class _NoTokenizerLib:
    """transformers' tokenizer classes for mlx-lm's imports: registering is a no-op,
    loading a tokenizer raises (the replay feeds token ids)."""

    def __init__(self, *a, **k):
        raise ImportError("transformers is not installed in the vllm-mlx venv (stub)")

    @classmethod
    def register(cls, *a, **k):
        pass

    @classmethod
    def from_pretrained(cls, *a, **k):
        raise ImportError("transformers is not installed in the vllm-mlx venv (stub)")


def _no_download(*a, **k):
    raise ImportError("huggingface_hub is not installed in the vllm-mlx venv (stub)")


def _load():
    """golden_replay, vllm-mlx's scheduler and request classes, and the versions."""
    import importlib.util

    for top in ("vllm_mlx", "mlx_lm"):
        if importlib.util.find_spec(top) is None:
            raise ImportError(f"{top} is not installed in this venv (tools/setup_venv_vllm_mlx.sh)")
    _stub("transformers", AutoTokenizer=_NoTokenizerLib, PreTrainedTokenizerFast=_NoTokenizerLib,
          PreTrainedTokenizer=_NoTokenizerLib)
    _stub("huggingface_hub", snapshot_download=_no_download)
    from .engines import _subpackages

    _subpackages("mlx_lm", "mlx-lm", "mlx_lm.models")  # without mlx_lm/__init__ (convert, server...)
    import mlx.core as mx
    import mlx_lm.sample_utils as su

    if not hasattr(su, "greedy_sampler"):  # mlx-lm 0.32's name; 0.31.3 samples greedily by argmax
        su.greedy_sampler = lambda logprobs: mx.argmax(logprobs, axis=-1)
    from . import golden_replay as gr
    from importlib.metadata import version

    import vllm_mlx
    from vllm_mlx import scheduler
    from vllm_mlx.request import Request, SamplingParams

    versions = f"{vllm_mlx.__version__} (mlx-lm {version('mlx-lm')})"
    return gr, scheduler, Request, SamplingParams, versions


class _Tokenizer:
    """The scheduler's tokenizer: requests carry token ids; no EOS (every request runs to
    max_tokens); its streaming detokenizer decodes to nothing."""

    eos_token_id = None
    clean_up_tokenization_spaces = False

    def encode(self, text):
        raise ValueError("the golden replay sends token ids")

    def decode(self, ids, **kw):
        return ""


class _Errors(logging.Handler):
    """Keeps the scheduler's logged generation errors (it catches them itself)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage().split("\n", 1)[0])


class _Response:
    def __init__(self, uid, token, finish_reason):
        self.uid, self.token, self.finish_reason = uid, token, finish_reason


class SchedulerDriver:
    """One scheduler over one model; requests are ids 'r<i>' carrying token ids."""

    def __init__(self, rp, sc, **config):
        self.rp, self.sc = rp, sc
        cfg = rp.sched.SchedulerConfig(max_kv_size=sc.max_kv_size or 0, **config)
        self.scheduler = rp.sched.Scheduler(rp.model, _Tokenizer(), cfg)
        store = self.scheduler.memory_aware_cache
        if store is not None:
            # MemoryCacheConfig.min_prefix_tokens (default 128) is a size threshold the
            # scheduler's config does not expose; the goldens' prompts are 15 tokens, so
            # at 128 the store would never serve them and prefix would not exercise it.
            import dataclasses

            store._config = dataclasses.replace(store._config, min_prefix_tokens=1)
        self.raw: dict[int, list] = {}  # request -> the raw logits rows its processor saw
        self.call_of_step: dict[int, list] = {}  # request -> per processor call: the model call
        self.requests = {}
        self.errors = _Errors()

    def __enter__(self):
        logging.getLogger("vllm_mlx.scheduler").addHandler(self.errors)
        return self

    def __exit__(self, *exc):
        logging.getLogger("vllm_mlx.scheduler").removeHandler(self.errors)
        self.scheduler._close_batch_generator()
        return False

    def add(self, i: int, prompt: list[int], taps=None) -> str:
        raw = self.raw.setdefault(i, [])
        calls = self.call_of_step.setdefault(i, [])

        def record(tokens, logits):
            raw.append(logits[0])
            if taps is not None:
                calls.append(taps.count() - 1)  # the model call that just ran
            return logits

        params = self.rp.SamplingParams(max_tokens=self.sc.steps, temperature=0.0, top_p=1.0,
                                        logits_processors=[record])
        rid = f"r{i}"
        req = self.rp.Request(rid, list(prompt), params)
        self.scheduler.add_request(req)
        self.requests[rid] = req
        return rid

    def step(self):
        """One scheduler step: (None, one response per token delivered); the scheduler's
        own caught error is raised with its logged message."""
        out = self.scheduler.step()
        responses = []
        for o in out.outputs:
            if o.finish_reason == "error":
                msg = self.errors.messages[-1] if self.errors.messages else "generation error"
                raise RuntimeError(f"vllm-mlx scheduler: {msg}")
            toks = list(o.new_token_ids or [])
            for k, t in enumerate(toks):
                responses.append(_Response(o.request_id, int(t), o.finish_reason if k == len(toks) - 1 else None))
        return None, responses

    def run_one(self, i, seq, taps=None):
        """Request i alone to its end; appends its tokens to seq."""
        rid = self.add(i, seq.prompt, taps)
        try:
            for _ in range(10 * (len(seq.prompt) + self.sc.steps) + 10):
                _, responses = self.step()
                for r in responses:
                    seq.tokens.append(r.token)
                if not self.scheduler.has_requests():
                    break
            else:
                raise RuntimeError("the scheduler did not finish the request")
        except Exception as e:
            seq.status = self.rp.gr._error(e)
        return rid

    def take(self, i, seq, taps=None):
        """The recorded logits (and attention rows) of request i's steps."""
        gr = self.rp.gr
        raw = self.raw.get(i, [])
        seq.logits = raw[: len(seq.tokens)]  # a call after the last token is not a step
        if taps is not None:
            calls = self.call_of_step[i][: len(seq.tokens)]
            seq.attn = [[layer_calls[c][0] for layer_calls in taps.calls] for c in calls]
        gr.mx.eval(seq.logits, seq.attn or [])


class VllmReplayer:
    """golden_replay.Replayer's metadata, with mlx-lm 0.31.3's loader, vllm-mlx's scheduler
    and MLX's safetensors writer."""

    engine = "vllm-mlx"

    def __init__(self, model_dir, model_id: str | None = None):
        self.gr, self.sched, self.Request, self.SamplingParams, self.engine_version = _load()
        from mlx_lm.utils import load_model

        logging.getLogger("vllm_mlx").setLevel(logging.ERROR)  # its per-request INFO lines
        self.dir = Path(model_dir)
        self.model, self.config = load_model(self.dir)
        self.model_id = model_id or self.dir.name
        self.vocab = int(self.config["vocab_size"])
        self.layers = len(self.model.layers)
        self.sha256 = self.gr.sha256_file(self.dir / "model.safetensors")
        self._widths = [layer.self_attn.o_proj.weight.shape[-1] for layer in self.model.layers]

    def metadata(self, r) -> dict[str, str]:
        # golden_replay.Replayer's, which reads only these attributes
        return self.gr.Replayer.metadata(self, r)

    def classes(self, sc) -> list[str]:
        """The classes a request of this scenario starts with: the model's make_cache,
        bounded as the scheduler bounds it (_bound_cache_layers) under max_kv_size."""
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        if sc.max_kv_size:
            cache = self.sched.Scheduler._bound_cache_layers(cache, sc.max_kv_size)
        return self.gr._classes(cache, self.layers)

    def replay(self, sc):
        gr = self.gr
        t0 = time.perf_counter()
        prompts = sc.request_prompts(self.vocab)
        if sc.kind == "batch":
            seqs = [gr.Sequence(p, attn=None) for p in prompts]
            with SchedulerDriver(self, sc) as d:
                def insert(indices):
                    return [d.add(i, prompts[i]) for i in indices]

                def stalled(responses, live, joined):
                    if not d.scheduler.has_requests() and (live or not joined):
                        raise RuntimeError("vllm-mlx's scheduler ran out of requests before every request finished")

                gr.drive_batch(sc, seqs, insert, d.step, d.scheduler.abort_request, stalled)
                for i, s in enumerate(seqs):
                    d.take(i, s)
        elif sc.kind == "single":
            seqs = [gr.Sequence(prompts[0])]
            with gr.Taps(self.model) as taps, SchedulerDriver(self, sc) as d:
                d.run_one(0, seqs[0], taps)
                d.take(0, seqs[0], taps)
        elif sc.kind == "prefix":
            seqs = [gr.Sequence(p) for p in prompts]
            with gr.Taps(self.model) as taps, SchedulerDriver(self, sc) as d:
                for i, s in enumerate(seqs):
                    rid = d.run_one(i, s, taps)
                    d.take(i, s, taps)
                seqs[1].reused = int(d.requests[rid].cached_tokens)
        else:
            raise ValueError(f"scenario kind {sc.kind} is not replayed through vllm-mlx")
        for s in seqs:
            del s.tokens[sc.steps:]
            s.logits = s.logits[: len(s.tokens)]
            if s.attn:
                s.attn = s.attn[: len(s.tokens)]
        return gr.Result(sc, seqs, self.classes(sc), time.perf_counter() - t0)

    def write(self, r, out_dir) -> Path:
        path = Path(out_dir) / f"{self.model_id}.{r.scenario.name}.{self.engine}.safetensors"
        tensors = self.gr.golden_tensors(r.sequences, self.vocab, self._widths)
        _write(self.gr.mx, path, tensors, self.metadata(r))
        r.path = path
        return path


def _write(mx, path: Path, tensors: dict, metadata: dict):
    """golden_replay.write_golden's file through MLX's safetensors writer (the venv has no
    safetensors package): same names, dtypes (int32, float32) and string metadata."""
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    try:
        mx.save_safetensors(tmp, {k: mx.array(v) for k, v in tensors.items()}, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# SwiftLM's "Test 9" asks for four concurrent requests with different per-request kv_bits
# (none, 8, 4, one more). vllm-mlx 0.6.0 takes none: SamplingParams (request.py) has no kv
# field, Scheduler._schedule_waiting inserts max_tokens, caches and logits_processors only,
# and kv_cache_quantization* are SchedulerConfig fields wired to the prefix store
# (MemoryCacheConfig) alone. What is reachable: four concurrent requests under each global
# setting, one scheduler per setting. The live cache is full precision under every one
# (vllm-mlx PR 62), so each row is judged against kvlab's single-request plain golden of the
# same prompt (kvlab has no golden of a quantized prefix store).
CONCURRENT_SETTINGS = {
    "none": {},
    "kvq8": dict(kv_cache_quantization=True, kv_cache_quantization_bits=8),
    "kvq4": dict(kv_cache_quantization=True, kv_cache_quantization_bits=4),
    "kvq4g32": dict(kv_cache_quantization=True, kv_cache_quantization_bits=4, kv_cache_quantization_group_size=32),
}
CONCURRENT_ROWS = 4


def concurrent(rp, plain, out_dir) -> list[Path]:
    """Test 9's reachable part: per CONCURRENT_SETTINGS, CONCURRENT_ROWS requests of
    `plain`'s prompt start together in one scheduler; each row is written as a one-sequence
    golden of `plain` (OUT/<model>.plain.vllm-mlx.<setting>.r<i>.safetensors)."""
    from .golden_scenario import parse_line

    gr = rp.gr
    prompt = plain.request_prompts(rp.vocab)[0]
    together = parse_line(f"concurrent prompts={','.join([str(len(prompt))] * CONCURRENT_ROWS)} steps={plain.steps}")
    paths = []
    for name, config in CONCURRENT_SETTINGS.items():
        seqs = [gr.Sequence(list(prompt), attn=None) for _ in range(CONCURRENT_ROWS)]
        with SchedulerDriver(rp, plain, **config) as d:
            store = d.scheduler.memory_aware_cache
            assert bool(store._config.kv_quantize) == bool(config), (name, store._config)

            def stalled(responses, live, joined):
                if not d.scheduler.has_requests() and live:
                    raise RuntimeError("vllm-mlx's scheduler ran out of requests before every request finished")

            gr.drive_batch(together, seqs, lambda idx: [d.add(i, seqs[i].prompt) for i in idx], d.step,
                           d.scheduler.abort_request, stalled)
            for i, s in enumerate(seqs):
                d.take(i, s)
        for i, s in enumerate(seqs):
            r = gr.Result(plain, [s], rp.classes(plain), 0.0)
            path = Path(out_dir) / f"{rp.model_id}.{plain.name}.{rp.engine}.{name}.r{i}.safetensors"
            _write(gr.mx, path, gr.golden_tensors([s], rp.vocab, rp._widths), rp.metadata(r))
            paths.append(path)
    return paths


def judge_concurrent(kvlab, golden: Path, paths) -> int:
    """kvlab golden diff of each row against kvlab's golden; prints a line per row, returns
    the number that do not pass."""
    import json
    import subprocess

    failed = 0
    for p in paths:
        out = subprocess.run([str(kvlab), "golden", "diff", str(golden), str(p), "--json"], capture_output=True, text=True)
        if out.returncode not in (0, 1):
            raise RuntimeError(f"kvlab golden diff {golden} {p} failed ({out.returncode}): {out.stderr}")
        rep = json.loads(out.stdout)
        s = rep["summary"]
        failed += rep["verdict"] != "pass"
        print(f"TEST9 {p.name}: {rep['verdict']} top-1 {100 * s['top1_agreement']:.1f}% max|dlogit| "
              f"{float(s['max_abs_dlogit']):.2g} vs {golden.name}" + ("" if rep["verdict"] == "pass" else
                                                          " | " + " | ".join(rep["reasons"])), flush=True)
    return failed


def reused_mismatches(ours, kvlab_meta: dict) -> list[str]:
    """The sequences whose reused prefix length differs from kvlab's golden's (metadata
    seq.<i>.reused; `kvlab golden diff` compares outputs, not how much came from a cache,
    so a store that recomputes everything would pass the prefix scenario unseen)."""
    out = []
    for i, s in enumerate(ours):
        want = kvlab_meta.get(f"seq.{i}.reused")
        if s.reused is None and want is None:
            continue
        if want is None or s.reused is None or int(want) != s.reused:
            out.append(f"seq {i} reused {s.reused}, kvlab's golden {want}")
    return out


def main(model_dir, scenarios_path, out_dir, model_id=None, golden_dir=None, concurrent_out=None, kvlab=None) -> int:
    """golden_dir: kvlab's goldens (golden/data); given, each replayed scenario's reused
    counts are checked against its kvlab golden's (exit 1 on a difference). concurrent_out
    (with golden_dir and kvlab): Test 9's reachable part (concurrent), each row judged
    against kvlab's plain golden (exit 1 on a row that does not pass)."""
    from .golden_scenario import read_scenarios

    rp = VllmReplayer(model_dir, model_id or Path(scenarios_path).name)
    rp.gr.require_regular_file(scenarios_path, "scenario file")
    scenarios = read_scenarios(scenarios_path)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    failed = 0
    for sc in scenarios:
        why = not_replayed(sc)
        marker = Path(out_dir) / f"{rp.model_id}.{sc.name}.{rp.engine}.not-replayed"
        if why is not None:
            print(f"{sc.name}: not replayed ({why})", flush=True)
            marker.write_text(why + "\n")  # tools/golden_table.py's "not replayed" row
            continue
        r = rp.replay(sc)
        rp.write(r, out_dir)
        print(rp.gr.summary(r), flush=True)
        if golden_dir is not None:
            mine = Path(golden_dir) / f"{rp.model_id}.{sc.name}.kvlab.safetensors"
            _, meta = rp.gr.mx.load(str(mine), return_metadata=True)
            for m in reused_mismatches(r.sequences, meta):
                failed += 1
                print(f"REUSED MISMATCH {rp.model_id} {sc.name}: {m}", flush=True)
    if concurrent_out is not None:
        if golden_dir is None or kvlab is None:
            raise ValueError("--concurrent-out needs --golden-dir and --kvlab (the rows are judged against kvlab's plain golden)")
        plain = [sc for sc in scenarios if sc.name == "plain"]
        if len(plain) != 1 or plain[0].kind != "single" or not_replayed(plain[0]):
            raise ValueError(f"{scenarios_path}: --concurrent-out needs one single-request scenario 'plain'")
        Path(concurrent_out).mkdir(parents=True, exist_ok=True)
        paths = concurrent(rp, plain[0], concurrent_out)
        failed += judge_concurrent(kvlab, Path(golden_dir) / f"{rp.model_id}.plain.kvlab.safetensors", paths)
    return 1 if failed else 0
