"""Goldens of mlx-lm: golden/README.md's scenarios replayed with mlx-lm's own machinery.

`python -m kvlab_mlx golden --model DIR --scenarios FILE --out OUTDIR` loads DIR with
`mlx_lm.utils.load_model`, and for every scenario line of FILE writes
OUTDIR/<model id>.<scenario>.mlx-lm.safetensors (format: golden/README.md "Golden files").

What runs, per scenario kind:
  single request   `generate_step` (greedy), with kv_bits / max_kv_size passed through
  save_at=K        `generate_step(max_tokens=K)`, whose last call produced token K;
                   `save_prompt_cache`, `load_prompt_cache`, then `generate_step` on the
                   loaded cache fed token K
  batch            `BatchGenerator`: `insert` (per-request logits processors), `next`,
                   `remove(uid)` after finish=R@K, `insert` of the joiner after step S;
                   batch_cache=device runs the same: kvlab's DeviceBatchKVCache is
                   BatchKVCache with its offsets in backend memory, and mlx-lm's
                   BatchKVCache already keeps `offset` as an mx.array on the device
  prefix           request 0 by `generate_step`; its cache goes into an `LRUPromptCache`
                   under prompt + generated tokens (as mlx-lm's server stores it), request
                   1 takes `fetch_nearest_cache` (trimmed copy, or nothing) and
                   `generate_step` processes the rest

What is recorded: a logits processor keeps the raw logits of every step (generate_step
and BatchGenerator call it after the model call and before any quantization), a
recording sampler (greedy_sampler) keeps each step's token, and each layer's
`self_attn.o_proj` is wrapped to keep the input row of the last position of every call.
generate_step pipelines (it computes step n+1 before it yields token n, and computes one
step more than max_tokens), so records are matched to steps by call order, never by
yields: a step is recorded when its call completed (the sampler ran); the extra step is
dropped. Where mlx-lm raises, the steps completed before are kept and the sequence's
status is `error: <type>: <message>`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .golden_scenario import (  # noqa: F401  (re-exported for the tests)
    Scenario, ScenarioError, parse_line, parse_scenarios, prompt_tokens, read_scenarios, splitmix64)

# ---- recording ------------------------------------------------------------------------------
# (MLX imported here: the parser above works without it.)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.generate import BatchGenerator, generate_step  # noqa: E402
from mlx_lm.models import cache as lm_cache  # noqa: E402
from mlx_lm.sample_utils import greedy_sampler  # noqa: E402


class _Tap(nn.Module):
    """Stands in for a layer's o_proj: records x[:, -1, :] of every call, then applies it."""

    def __init__(self, inner, record):
        super().__init__()
        self.inner = inner
        self._record = record

    def __call__(self, x):
        self._record(x[:, -1, :])
        return self.inner(x)


class Taps:
    """Wraps every layer's self_attn.o_proj while active; calls[l] is layer l's list of
    recorded rows, one per model call (every call runs every layer once)."""

    def __init__(self, model):
        self.model = model
        self.layers = list(model.layers)
        self.calls: list[list] = [[] for _ in self.layers]
        self.widths = [layer.self_attn.o_proj.weight.shape[-1] for layer in self.layers]

    def __enter__(self):
        for l, layer in enumerate(self.layers):
            layer.self_attn.o_proj = _Tap(layer.self_attn.o_proj, self.calls[l].append)
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.self_attn.o_proj = layer.self_attn.o_proj.inner
        return False

    def count(self) -> int:
        return len(self.calls[0])


@dataclass
class Sequence:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list = field(default_factory=list)  # mx arrays (vocab,)
    attn: list | None = field(default_factory=list)  # per step: [per layer mx (width,)]; None: not recorded
    status: str = "ok"
    reused: int | None = None


def _error(e: BaseException) -> str:
    return f"error: {type(e).__name__}: {e}".replace("\n", " ")


class _Steps:
    """The processor and sampler for generate_step: step s is the s-th call that ran the
    logits processor, and is complete once the sampler ran for it. With a teacher (the
    tokens of steps first, first + 1, ...), the sampler still records its own greedy
    token but returns the teacher's, which generate_step feeds as the next input."""

    def __init__(self, taps: Taps, teacher: list[int] | None = None, first: int = 0):
        self.taps = taps
        self.teacher, self.first = teacher, first
        self.logits, self.call_of_step, self.sampled, self.fed = [], [], [], []

    def processor(self, tokens, logits):
        self.logits.append(logits[0])
        self.call_of_step.append(self.taps.count() - 1)  # the call that just ran
        return logits

    def sampler(self, logprobs):
        y = greedy_sampler(logprobs)
        self.sampled.append(y)
        step = self.first + len(self.sampled) - 1
        # Past the teacher's tokens only the look-ahead call is left, whose step is dropped.
        if self.teacher is not None and step < len(self.teacher):
            y = mx.array([self.teacher[step]], dtype=y.dtype)
        self.fed.append(y)
        return y

    def take(self, seq: Sequence, limit: int):
        """Append the first `limit` completed steps to seq; returns (count, tokens fed)."""
        n = min(limit, len(self.sampled))
        mx.eval(self.sampled[:n], self.logits[:n], self.fed[:n])
        seq.tokens += [int(y.item()) for y in self.sampled[:n]]
        seq.logits += self.logits[:n]
        seq.attn += [[calls[self.call_of_step[s]][0] for calls in self.taps.calls] for s in range(n)]
        return n, [int(y.item()) for y in self.fed[:n]]


def _generate(model, taps, seq, prompt, steps, sc, cache, teacher=None, first=0):
    """generate_step over `prompt` on `cache` with max_tokens=steps: appends the completed
    steps (at most steps + 1: the call after the last yield is complete too) to seq and
    returns (steps appended, tokens fed after them, exception or None). `teacher`, when
    given, is the sequence's teacher tokens; `first` the step this call pattern starts at."""
    rec = _Steps(taps, teacher, first)
    yielded = []
    gen = generate_step(mx.array(prompt), model, max_tokens=steps, sampler=rec.sampler,
                        logits_processors=[rec.processor], max_kv_size=sc.max_kv_size, prompt_cache=cache,
                        kv_bits=sc.kv_bits, kv_group_size=sc.kv_group_size,
                        quantized_kv_start=sc.quantized_kv_start)
    err = drain(gen, yielded)
    n, fed = rec.take(seq, steps + 1)
    assert fed[: len(yielded)] == yielded, "yields differ from the tokens the sampler fed"
    return n, fed, err


def drain(gen, yielded) -> Exception | None:
    """Runs an engine's token generator to its end, appending each token to `yielded`;
    the engine's own raise is returned (recorded by the caller), never fatal."""
    try:
        for y, _ in gen:
            yielded.append(int(y))
    except Exception as e:
        return e
    finally:
        gen.close()
    return None


def _offsets(cache):
    return [c.offset for c in cache]


def _classes(cache, layers: int) -> list[str]:
    """Per layer: the class of its cache entry; layers past the list (KV-shared layers of
    gemma4_text, which the model pads with None) are `shared`."""
    return [type(cache[l]).__name__ if l < len(cache) else "shared" for l in range(layers)]


def _replay_single(model, taps, sc: Scenario, prompt, teacher=None) -> tuple[list[Sequence], list]:
    seq = Sequence(prompt)
    cache = lm_cache.make_prompt_cache(model, max_kv_size=sc.max_kv_size)
    _, _, err = _generate(model, taps, seq, prompt, sc.steps, sc, cache, teacher)
    _finish(seq, sc.steps, err)
    return [seq], cache


def _finish(seq: Sequence, steps: int, err):
    """Drops the steps past `steps` (generate_step's look-ahead call) and sets the status."""
    del seq.tokens[steps:], seq.logits[steps:], seq.attn[steps:]
    if err is not None:
        seq.status = _error(err)


def _replay_save_load(model, taps, sc: Scenario, prompt, teacher=None):
    seq = Sequence(prompt)
    k = sc.save_at
    cache = lm_cache.make_prompt_cache(model, max_kv_size=sc.max_kv_size)
    # max_tokens=K: the calls over the prompt and tokens 0..K-1; the last one produced token K.
    n, fed, err = _generate(model, taps, seq, prompt, k, sc, cache, teacher)
    if err is not None:
        _finish(seq, sc.steps, err)
        return [seq], cache
    assert n == k + 1, (n, k)
    want = len(prompt) + k  # the cache holds the prompt and tokens 0..K-1
    assert all(o == want for o in _offsets(cache)), (_offsets(cache), want)
    try:
        with tempfile.TemporaryDirectory(prefix="kvlab-golden-") as tmp:
            path = os.path.join(tmp, "cache.safetensors")
            lm_cache.save_prompt_cache(path, cache)
            loaded = lm_cache.load_prompt_cache(path)
    except Exception as e:  # mlx-lm cannot save or load these caches: steps 0..K stand
        _finish(seq, sc.steps, e)
        return [seq], cache
    assert [type(c) for c in loaded] == [type(c) for c in cache], "load_prompt_cache changed the classes"
    assert _offsets(loaded) == _offsets(cache), (_offsets(loaded), _offsets(cache))
    # Token K (the one fed: the teacher's when forced) is the prompt of the continuation:
    # its first call produces token K+1.
    _, _, err = _generate(model, taps, seq, [fed[k]], sc.steps - k - 1, sc, loaded, teacher, k + 1)
    _finish(seq, sc.steps, err)
    return [seq], loaded


def _replay_prefix(model, taps, sc: Scenario, prompts, model_key: str, teachers=(None, None)):
    first = Sequence(prompts[0])
    cache0 = lm_cache.make_prompt_cache(model, max_kv_size=sc.max_kv_size)
    _, fed0, err0 = _generate(model, taps, first, prompts[0], sc.steps, sc, cache0, teachers[0])
    _finish(first, sc.steps, err0)
    store = lm_cache.LRUPromptCache()
    if err0 is None:
        # As mlx-lm's server stores a finished request: under prompt + every token fed
        # back (the generated ones, or the teacher's), which the look-ahead call of
        # generate_step has put into the cache too.
        key = prompts[0] + fed0[: sc.steps]
        assert all(o == len(key) for o in _offsets(cache0)), (_offsets(cache0), len(key))
        store.insert_cache(model_key, key, cache0)
    second = Sequence(prompts[1])
    cache1, rest = store.fetch_nearest_cache(model_key, prompts[1])
    second.reused = len(prompts[1]) - len(rest)
    if cache1 is None:
        cache1 = lm_cache.make_prompt_cache(model, max_kv_size=sc.max_kv_size)
    assert all(o == second.reused for o in _offsets(cache1)), (_offsets(cache1), second.reused)
    _, _, err1 = _generate(model, taps, second, rest, sc.steps, sc, cache1, teachers[1])
    _finish(second, sc.steps, err1)
    return [first, second], cache1


def drive_batch(sc: Scenario, seqs, insert, step, remove, stalled, finished=None):
    """The batch scenarios' schedule (golden/README.md), on any engine's batch generator:
    the first len(sc.prompts) requests start together; request finish[0] is removed once it
    holds finish[1] tokens; the join request (the last) enters after decode round join[1] of
    those that started together. insert(indices) -> uids; step() -> (_, responses with uid,
    token, finish_reason); remove(uid); stalled(responses, live, joined) raises when the
    engine can go no further; finished(i, response) sees each request that ends by itself.
    An engine's exception marks every request not yet done with it, never fatal."""
    n_start = len(sc.prompts)
    uid_of, done, live = {}, set(), set()
    try:
        uid_of.update({u: i for i, u in enumerate(insert(list(range(n_start))))})
        live.update(range(n_start))
        joined = sc.join is None
        rounds = 0  # decode rounds that delivered tokens to the requests that started together
        while live or not joined:
            _, responses = step()
            for r in responses:
                i = uid_of[r.uid]
                seqs[i].tokens.append(r.token)
                if r.finish_reason is not None:
                    live.discard(i)
                    done.add(i)
                    if finished is not None:
                        finished(i, r)
                elif sc.finish is not None and i == sc.finish[0] and len(seqs[i].tokens) == sc.finish[1]:
                    remove(r.uid)
                    live.discard(i)
                    done.add(i)
            if any(uid_of[r.uid] < n_start for r in responses):
                if not joined and rounds == sc.join[1]:  # after decode step S: token S delivered
                    j = len(seqs) - 1
                    (u,) = insert([j])
                    uid_of[u] = j
                    live.add(j)
                    joined = True
                rounds += 1
            stalled(responses, live, joined)
    except Exception as e:  # the engine's own raise: recorded, never fatal
        for i, s in enumerate(seqs):
            if i not in done:
                s.status = _error(e)


def _replay_batch(model, sc: Scenario, prompts, layers: int):
    seqs = [Sequence(p, attn=None) for p in prompts]
    classes = None
    if sc.kv_bits is not None:
        for s in seqs:
            s.status = "error: Unsupported: mlx-lm 0.32.2's BatchGenerator takes no kv_bits"
        return seqs, _classes(lm_cache.make_prompt_cache(model, sc.max_kv_size), layers)

    raw = [[] for _ in seqs]  # per request: the processor's logits, one per call it was in

    def processor(i):
        def record(tokens, logits):
            raw[i].append(logits[0])
            return logits
        return record

    gen = BatchGenerator(model, max_tokens=sc.steps, max_kv_size=sc.max_kv_size)

    def insert(indices):
        return gen.insert([prompts[i] for i in indices], max_tokens=[sc.steps] * len(indices),
                          logits_processors=[[processor(i)] for i in indices])

    def finished(i, r):
        nonlocal classes
        classes = _classes(r.prompt_cache, layers)

    def stalled(responses, live, joined):
        if not responses and not live and not joined:
            raise RuntimeError(f"join={sc.join[0]}@{sc.join[1]}: the batch ended before step {sc.join[1]}")

    try:
        drive_batch(sc, seqs, insert, gen.next, lambda uid: gen.remove([uid]), stalled, finished)
    finally:
        gen.close()
    for s, logits in zip(seqs, raw):
        s.logits = logits[: len(s.tokens)]  # the call after the last token is not a step
    mx.eval([s.logits for s in seqs])
    if classes is None:
        classes = _classes(lm_cache.make_prompt_cache(model, sc.max_kv_size), layers)
    return seqs, classes


# ---- golden files ---------------------------------------------------------------------------

def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _kvlab_commit() -> str:
    return os.environ.get("KVLAB_COMMIT") or "unknown"


def golden_tensors(seqs: list[Sequence], vocab: int, widths: list[int]) -> dict[str, np.ndarray]:
    out = {}
    for i, s in enumerate(seqs):
        steps = len(s.tokens)
        out[f"seq.{i}.prompt"] = np.asarray(s.prompt, dtype=np.int32).reshape(-1)
        out[f"seq.{i}.tokens"] = np.asarray(s.tokens, dtype=np.int32).reshape(steps)
        rows = [np.asarray(x, dtype=np.float32) for x in s.logits]
        out[f"seq.{i}.logits"] = np.stack(rows) if rows else np.zeros((0, vocab), np.float32)
        assert out[f"seq.{i}.logits"].shape == (steps, vocab)
        if s.attn is not None:
            assert len(s.attn) == steps
            for l, w in enumerate(widths):
                rows = [np.asarray(step[l], dtype=np.float32) for step in s.attn]
                out[f"seq.{i}.attn.{l}"] = np.stack(rows) if rows else np.zeros((0, w), np.float32)
                assert out[f"seq.{i}.attn.{l}"].shape == (steps, w)
    return out


def write_golden(path, tensors: dict, metadata: dict):
    from safetensors.numpy import save_file

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@dataclass
class Result:
    scenario: Scenario
    sequences: list[Sequence]
    cache_classes: list[str]
    seconds: float
    path: Path | None = None
    teacher_forced: bool = False


class Replayer:
    """One model directory, loaded once, replaying scenarios."""

    engine = "mlx-lm"  # the name in the metadata and the file name (golden_replay_vlm overrides it)

    def __init__(self, model_dir, model_id: str | None = None):
        import mlx_lm
        from mlx_lm.utils import load_model

        self.dir = Path(model_dir)
        self.model, self.config = load_model(self.dir)
        self.model_id = model_id or self.dir.name
        self.vocab = int(self.config["vocab_size"])
        self.layers = len(self.model.layers)
        self.sha256 = sha256_file(self.dir / "model.safetensors")
        self.engine_version = mlx_lm.__version__

    def replay(self, sc: Scenario, teacher: list[list[int]] | None = None) -> Result:
        """One scenario; `teacher` (check_teacher's result) feeds each sequence its
        teacher's tokens instead of its own (teacher forcing)."""
        t0 = time.perf_counter()
        prompts = sc.request_prompts(self.vocab)
        t = teacher if teacher is not None else [None] * len(prompts)
        with Taps(self.model) as taps:
            widths = taps.widths
            kind = sc.kind
            if kind == "single":
                seqs, cache = _replay_single(self.model, taps, sc, prompts[0], t[0])
            elif kind == "save_load":
                seqs, cache = _replay_save_load(self.model, taps, sc, prompts[0], t[0])
            elif kind == "prefix":
                seqs, cache = _replay_prefix(self.model, taps, sc, prompts, self.model_id, t)
            else:
                seqs, cache = None, None
        if kind == "batch":
            assert teacher is None, "check_teacher refuses batch scenarios"
            # batch_cache picks kvlab's class only; BatchGenerator's BatchKVCache is the
            # counterpart of both (see the module docstring).
            seqs, classes = _replay_batch(self.model, sc, prompts, self.layers)
        else:
            classes = _classes(cache, self.layers)
        self._widths = widths
        return Result(sc, seqs, classes, time.perf_counter() - t0, teacher_forced=teacher is not None)

    def metadata(self, r: Result) -> dict[str, str]:
        sc = r.scenario
        meta = {"kvlab.golden": "1", "model": self.model_id, "model_sha256": self.sha256,
                "scenario": sc.name, "scenario_line": sc.line, "engine": self.engine,
                "engine_version": self.engine_version, "backend": f"mlx-{mx.default_device().type.name}",
                "kvlab_commit": _kvlab_commit(), "sequences": str(len(r.sequences)),
                "layers": str(self.layers), "cache_classes": ",".join(r.cache_classes)}
        if r.teacher_forced:
            meta["teacher_forced"] = "1"
        for i, s in enumerate(r.sequences):
            meta[f"seq.{i}.status"] = s.status
            if s.reused is not None:
                meta[f"seq.{i}.reused"] = str(s.reused)
        return meta

    def write(self, r: Result, out_dir) -> Path:
        path = Path(out_dir) / f"{self.model_id}.{r.scenario.name}.{self.engine}.safetensors"
        write_golden(path, golden_tensors(r.sequences, self.vocab, self._widths), self.metadata(r))
        r.path = path
        return path


def summary(r: Result) -> str:
    steps = ",".join(str(len(s.tokens)) for s in r.sequences)
    statuses = "; ".join(s.status for s in r.sequences)
    reused = [str(s.reused) for s in r.sequences if s.reused is not None]
    extra = f" reused={','.join(reused)}" if reused else ""
    return (f"{r.scenario.name}: sequences={len(r.sequences)} steps={steps} status={statuses}{extra} "
            f"cache_classes={','.join(r.cache_classes)} {r.seconds:.2f}s")


def require_regular_file(path, noun: str):
    """A FIFO would block open() forever, a directory or a device reads as nonsense."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ValueError(f"cannot open {noun} '{path}': {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{noun} '{path}' is not a regular file")


def read_teacher(path) -> tuple[dict, list[tuple[list[int], list[int]]]]:
    """A golden's metadata and (prompt, tokens) per sequence (golden/README.md)."""
    from safetensors import safe_open

    require_regular_file(path, "teacher golden")
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        if meta.get("kvlab.golden") != "1":
            raise ValueError(f"teacher '{path}': metadata kvlab.golden is {meta.get('kvlab.golden')!r}, not '1'")
        count = int(meta.get("sequences", "-1"))
        names = set(f.keys())
        seqs = []
        for i in range(count):
            if f"seq.{i}.prompt" not in names or f"seq.{i}.tokens" not in names:
                raise ValueError(f"teacher '{path}': sequence {i} has no prompt or tokens")
            seqs.append((f.get_tensor(f"seq.{i}.prompt").tolist(), f.get_tensor(f"seq.{i}.tokens").tolist()))
    return meta, seqs


def check_teacher(sc: Scenario, vocab: int, seqs) -> list[list[int]]:
    """As kvlab's check_teacher (golden/runner/runner.cc): one sequence per request with the same
    prompt and a token for every input the scenario feeds. Returns the token lists."""
    if sc.kind == "batch":
        raise ValueError(f"--teacher: scenario '{sc.name}' is a batch; the adapter forces single requests only "
                         "(BatchGenerator samples every row with one sampler)")
    prompts = sc.request_prompts(vocab)
    if len(seqs) != len(prompts):
        raise ValueError(f"--teacher: scenario '{sc.name}' runs {len(prompts)} sequence(s), "
                         f"the teacher has {len(seqs)}")
    for i, ((prompt, tokens), want) in enumerate(zip(seqs, prompts)):
        if prompt != want:
            raise ValueError(f"--teacher: the teacher's sequence {i} has another prompt than scenario "
                             f"'{sc.name}' gives it")
        if len(tokens) < sc.steps - 1:
            raise ValueError(f"--teacher: the teacher's sequence {i} has {len(tokens)} tokens, "
                             f"the scenario feeds {sc.steps - 1}")
    return [tokens for _, tokens in seqs]


def main(model_dir, scenarios_path, names, out_dir, model_id=None, teacher_path=None) -> int:
    require_regular_file(scenarios_path, "scenario file")
    for f in ("config.json", "model.safetensors"):
        require_regular_file(Path(model_dir) / f, "model file")
    scenarios = read_scenarios(scenarios_path)
    if teacher_path is not None and (not names or len(names) != 1):
        raise ValueError("--teacher needs exactly one --scenario (the teacher's)")
    if names:
        known = {s.name for s in scenarios}
        missing = [n for n in names if n not in known]
        if missing:
            raise ScenarioError(f"{scenarios_path}: no scenario {', '.join(map(repr, missing))}")
        scenarios = [s for s in scenarios if s.name in set(names)]
    model_id = model_id or Path(scenarios_path).name
    os.makedirs(out_dir, exist_ok=True)
    rp = Replayer(model_dir, model_id)
    teacher = None
    if teacher_path is not None:
        meta, seqs = read_teacher(teacher_path)
        if meta.get("model_sha256") not in (None, rp.sha256):
            raise ValueError(f"--teacher: '{teacher_path}' is a golden of other weights (model_sha256 "
                             f"{meta.get('model_sha256')}, this model's is {rp.sha256})")
        teacher = check_teacher(scenarios[0], rp.vocab, seqs)
    for sc in scenarios:
        r = rp.replay(sc, teacher)
        rp.write(r, out_dir)
        print(summary(r), flush=True)
    return 0
