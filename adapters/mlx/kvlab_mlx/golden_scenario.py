"""golden/README.md's scenario lines and prompt tokens, as kvlab's golden/files/scenario.cc reads
them (no MLX: tools and tests use it without the engine)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# ---- scenario lines (golden/README.md "Scenarios") ---------------------------------------

_M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """harness/rng.h's splitmix64 on unsigned 64-bit wrap-around."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def prompt_tokens(seed: int, p: int, length: int, vocab: int) -> list[int]:
    """Prompt p's tokens: splitmix64(seed*1000003 + p*10007 + j) mod vocab, all in uint64."""
    base = (seed * 1000003 + p * 10007) & _M64
    return [splitmix64((base + j) & _M64) % vocab for j in range(length)]


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_UINT = re.compile(r"^[0-9]+$")
_AT = re.compile(r"^([0-9]+)@([0-9]+)$")
_REAL = re.compile(r"^[+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")

KV_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize's affine mode takes
# kvlab's caps (golden/files/scenario.cc): a line asking for more is a mistake, and a replay of
# it would run for hours and write gigabytes before anyone noticed.
MAX_STEPS = 4096
MAX_PROMPT = 4096
MAX_REQUESTS = 16
KV_GROUP_SIZES = (32, 64, 128)


class ScenarioError(ValueError):
    pass


@dataclass
class Scenario:
    name: str
    line: str
    prompts: list[int]
    steps: int
    seed: int = 1
    kv_bits: int | None = None
    kv_group_size: int = 64
    quantized_kv_start: int = 5000
    max_kv_size: int | None = None
    finish: tuple[int, int] | None = None  # (request, tokens)
    join: tuple[int, int] | None = None  # (prompt length, after decode step)
    prefix: int | None = None
    second: int | None = None
    save_at: int | None = None
    batch_cache: str = "host"  # "device": kvlab's DeviceBatchKVCache; mlx-lm's counterpart is BatchKVCache
    tolerance: dict[str, float] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        if self.prefix is not None:
            return "prefix"
        if self.save_at is not None:
            return "save_load"
        if len(self.prompts) > 1 or self.finish is not None or self.join is not None:
            return "batch"
        return "single"

    def request_prompts(self, vocab: int) -> list[list[int]]:
        """Every request's prompt, in README order: `prompts`, then the joiner, then `second`."""
        out = [prompt_tokens(self.seed, p, n, vocab) for p, n in enumerate(self.prompts)]
        if self.join is not None:
            out.append(prompt_tokens(self.seed, len(out), self.join[0], vocab))
        if self.prefix is not None:
            out.append(out[0][: self.prefix] + prompt_tokens(self.seed, len(out), self.second, vocab))
        return out


def parse_line(text: str, where: str = "") -> Scenario | None:
    """One scenario line (`#` comments, blank lines give None). Strict: an unknown or
    repeated key, a bad value, or keys that do not go together raise ScenarioError naming
    the key and the line."""
    line = text.split("#", 1)[0].strip()
    if not line:
        return None
    at = f"{where}: " if where else ""

    def fail(msg):
        raise ScenarioError(f"{at}{msg} in scenario line {line!r}")

    words = line.split()
    name = words[0]
    if "=" in name or not _NAME.match(name):
        fail(f"{name!r} is not a scenario name")
    kv: dict[str, str] = {}
    for w in words[1:]:
        key, eq, value = w.partition("=")
        if not eq or not key or not value:
            fail(f"{w!r} is not key=value")
        if key in kv:
            fail(f"key {key!r} repeated")
        kv[key] = value

    def uint(key, lo=0):
        v = kv[key]
        if not _UINT.match(v) or int(v) < lo:
            fail(f"{key}={v}: not an integer >= {lo}")
        return int(v)

    def at_pair(key):
        m = _AT.match(kv[key])
        if not m:
            fail(f"{key}={kv[key]}: not A@B with integers")
        return int(m.group(1)), int(m.group(2))

    def real(key):
        v = kv[key]
        if not _REAL.match(v):
            fail(f"{key}={v}: not a non-negative number")
        return float(v)

    known = {"prompts", "steps", "seed", "kv_bits", "kv_group_size", "quantized_kv_start", "max_kv_size",
             "finish", "join", "prefix", "second", "save_at", "batch_cache", "max_dlogit", "max_mean_kld", "min_top1",
             "attn_rel"}
    for key in kv:
        if key not in known:
            fail(f"unknown key {key!r}")
    for key in ("prompts", "steps"):
        if key not in kv:
            fail(f"required key {key!r} missing")

    prompts = []
    for part in kv["prompts"].split(","):
        if not _UINT.match(part) or int(part) < 1:
            fail(f"prompts={kv['prompts']}: {part!r} is not a prompt length >= 1")
        if int(part) > MAX_PROMPT:
            fail(f"prompts={kv['prompts']}: {part} is above the cap of {MAX_PROMPT} tokens")
        prompts.append(int(part))
    if len(prompts) > MAX_REQUESTS:
        fail(f"prompts={kv['prompts']}: more than {MAX_REQUESTS} requests")
    s = Scenario(name=name, line=line, prompts=prompts, steps=uint("steps", 1))
    if s.steps > MAX_STEPS:
        fail(f"steps={s.steps}: above the cap of {MAX_STEPS} (kvlab's)")
    if "seed" in kv:
        s.seed = uint("seed")
        if s.seed > _M64:
            fail(f"seed={s.seed}: above 2^64-1")
    if "kv_bits" in kv:
        s.kv_bits = uint("kv_bits", 1)
        if s.kv_bits not in KV_BITS:
            fail(f"kv_bits={s.kv_bits}: not one of {','.join(map(str, KV_BITS))}")
    for key in ("kv_group_size", "quantized_kv_start"):
        if key in kv and s.kv_bits is None:
            fail(f"key {key!r} without kv_bits")
    if "kv_group_size" in kv:
        s.kv_group_size = uint("kv_group_size", 1)
        if s.kv_group_size not in KV_GROUP_SIZES:
            fail(f"kv_group_size={s.kv_group_size}: not one of {','.join(map(str, KV_GROUP_SIZES))}")
    if "quantized_kv_start" in kv:
        s.quantized_kv_start = uint("quantized_kv_start")
    if "max_kv_size" in kv:
        s.max_kv_size = uint("max_kv_size", 1)
    if "finish" in kv:
        r, k = at_pair("finish")
        requests = len(prompts) + (1 if "join" in kv else 0)
        if r >= requests:
            fail(f"finish={kv['finish']}: request {r} does not exist ({requests} requests)")
        if not 1 <= k < s.steps:
            fail(f"finish={kv['finish']}: K must be in [1, steps)")
        s.finish = (r, k)
    if "join" in kv:
        p, st = at_pair("join")
        if p < 1:
            fail(f"join={kv['join']}: prompt length must be >= 1")
        if p > MAX_PROMPT:
            fail(f"join={kv['join']}: prompt length above the cap of {MAX_PROMPT} tokens")
        if st >= s.steps:
            fail(f"join={kv['join']}: step S must be < steps")
        s.join = (p, st)
    if ("prefix" in kv) != ("second" in kv):
        fail("keys 'prefix' and 'second' go together")
    if "prefix" in kv:
        s.prefix, s.second = uint("prefix", 1), uint("second", 1)
        if s.second > MAX_PROMPT:
            fail(f"second={s.second}: above the cap of {MAX_PROMPT} tokens")
        if s.prefix > prompts[0]:
            fail(f"prefix={s.prefix}: longer than prompt 0 ({prompts[0]})")
    if "save_at" in kv:
        s.save_at = uint("save_at")
        if s.save_at >= s.steps:
            fail(f"save_at={s.save_at}: must be < steps")
    for key in ("max_dlogit", "max_mean_kld", "min_top1", "attn_rel"):
        if key in kv:
            s.tolerance[key] = real(key)
    if s.tolerance.get("min_top1", 0.0) > 1.0:
        fail(f"min_top1={kv['min_top1']}: above 1")
    batch = len(prompts) > 1 or s.finish is not None or s.join is not None
    if s.prefix is not None and (batch or s.save_at is not None):
        fail("key 'prefix' goes with one prompt and no finish/join/save_at")
    if s.save_at is not None and batch:
        fail("key 'save_at' goes with one prompt and no finish/join")
    if "batch_cache" in kv:
        s.batch_cache = kv["batch_cache"]
        if s.batch_cache not in ("host", "device"):
            fail(f"batch_cache={s.batch_cache}: not host or device")
        if not batch:
            fail("key 'batch_cache' applies to a batch (several prompts, finish, join)")
        # kvlab's DeviceBatchKVCache has no filter/extend: a device batch keeps its rows.
        if s.batch_cache == "device" and (s.finish is not None or s.join is not None):
            fail("batch_cache=device cannot run finish=/join= (DeviceBatchKVCache has no filter/extend)")
    return s


def parse_scenarios(text: str, where: str = "") -> list[Scenario]:
    out, names = [], set()
    for n, raw in enumerate(text.splitlines(), 1):
        s = parse_line(raw, f"{where}:{n}" if where else f"line {n}")
        if s is None:
            continue
        if s.name in names:
            raise ScenarioError(f"{where}:{n}: scenario {s.name!r} repeated")
        names.add(s.name)
        out.append(s)
    return out


def read_scenarios(path) -> list[Scenario]:
    with open(path, encoding="utf-8") as f:
        return parse_scenarios(f.read(), str(path))
