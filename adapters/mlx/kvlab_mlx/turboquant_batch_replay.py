"""mlx-vlm 0.7.10's BatchTurboQuantKVCache judged by invariants, each batch row against
mlx-vlm's own single-sequence TurboQuantKVCache (same codec, same seed) fed the row's
real tokens (docs/turboquant.md §Batches against mlx-vlm).

    python -m kvlab_mlx.turboquant_batch_replay --seed S --count N [--known FILE]
    python -m kvlab_mlx.turboquant_batch_replay --seed S --only I     (one sequence, verbose)

Each sequence is data drawn from one seed (`plan`): a codec configuration and a list of
operations (a left-padded prefill in chunks, decode steps, a filter of a row subset, an
extend with a second batch prefilled apart, a trim, a state round trip, a held state
snapshot). `run_plan` interprets it against the batch cache and one reference cache per
row, and checks after every operation:

  row      the row's packed codes (every leaf of the state: norms, indices, ...) over
           its real tokens, bit for bit, and after every update the decoded K/V that the
           attention fallback reads (`dequantize` of the fetched state), bit for bit:
           the codec quantizes each token alone (per-token norm, fixed rotation and
           codebook from the seed), so a row's codes cannot depend on its batch;
  position offset[b] is the row's real token count, left_padding[b] = _idx - that count,
           and `make_mask(N)` lets query i of row b see exactly keys left_padding[b] ..
           _idx + i;
  snapshot a state taken (the tuple `state` returns) still reads as it did when taken
           after the cache goes on (a prompt-cache save holds it; so does the round trip).

filter, extend, trim and the round trip are judged by the same checks after they run
(the reference drops, appends, trims, or keeps its rows). Every finding is a line
`<op> what=<what> dim=D bits=B` matched against the register given with --known
(kvlab_mlx/known.py's format): each finding must match an entry, each entry a finding.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import engines, known

DIMS = (64, 96)  # 64: the Hadamard (RHT) rotation; 96: the dense QR rotation
BITS = (3, 4, 3.5)  # integer MSE codecs and the split (fractional) codec


def _load():
    engines._subpackages("mlx_vlm", "mlx-vlm (tools/setup_venv.sh)", "mlx_vlm.models")
    import mlx.core as mx
    import mlx_vlm.turboquant as tq

    return mx, tq


# ── the plan: one seeded sequence as data ───────────────────────────────────────────


def _prefill(rng, rows):
    lens = [int(x) for x in rng.integers(1, 12, size=rows)]
    total = max(lens)
    chunks, left = [], total
    while left:
        c = int(rng.integers(1, left + 1))
        chunks.append(c)
        left -= c
    return {"lens": lens, "chunks": chunks, "decode": int(rng.integers(0, 3))}


def plan(seed: int) -> dict:
    """The sequence of seed `seed`: a configuration and its operations, all drawn here."""
    rng = np.random.default_rng(seed)
    cfg = {
        "dim": int(rng.choice(DIMS)),
        "heads": int(rng.integers(1, 3)),
        "bits": float(BITS[int(rng.integers(len(BITS)))]),
        "codec_seed": int(rng.integers(0, 1000)),
    }
    ops = [dict(op="prefill", **_prefill(rng, int(rng.integers(1, 5))))]
    rows = len(ops[0]["lens"])
    weights = {"decode": 4, "filter": 2, "extend": 2, "extend_empty": 0.5, "trim": 2, "roundtrip": 1, "snapshot": 1}
    names = list(weights)
    p = np.array([weights[n] for n in names], float)
    for _ in range(int(rng.integers(4, 10))):
        name = names[int(rng.choice(len(names), p=p / p.sum()))]
        if name == "decode":
            ops.append({"op": "decode", "n": int(rng.integers(1, 4))})
        elif name == "filter":
            if rows < 2:
                continue
            k = int(rng.integers(1, rows))
            keep = sorted(int(i) for i in rng.choice(rows, size=k, replace=False))
            if rng.random() < 0.3:
                keep = [int(i) for i in rng.permutation(keep)]
            ops.append({"op": "filter", "keep": keep})
            rows = k
        elif name == "extend":
            other = _prefill(rng, int(rng.integers(1, 4)))
            ops.append(dict(op="extend", **other))
            rows += len(other["lens"])
        elif name == "extend_empty":
            k = int(rng.integers(1, 3))
            ops.append({"op": "extend_empty", "rows": k, "side": "other" if rng.random() < 0.5 else "self"})
            rows += k
        elif name == "trim":
            ops.append({"op": "trim", "n": int(rng.integers(1, 3))})  # clipped at run time
        else:
            ops.append({"op": name})
    return {"seed": seed, "config": cfg, "ops": ops}


# ── observing the states ──────────────────────────────────────────────────────────────


def _leaves(state, prefix=""):
    """Every array of a TurboQuant state (nested NamedTuples), as (name, array)."""
    out = []
    for name, value in zip(state._fields, state):
        if isinstance(value, tuple):
            out += _leaves(value, f"{prefix}{name}.")
        else:
            out.append((prefix + name, value))
    return out


def _bits(a):
    """An array as exact bits (float as its integer view) for comparison."""
    a = np.array(a)
    if a.dtype.kind == "f":
        return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
    return a


class Broken(Exception):
    """The cache is past judging (its storage and its rows disagree): the sequence stops
    at its first such finding, so what follows from it is not counted again."""


class Run:
    """A batch cache and its per-row reference caches, driven through a plan."""

    def __init__(self, mx, tq, cfg, rng, record):
        self.mx, self.tq, self.cfg, self.rng = mx, tq, cfg, rng
        self.record = record  # record(op, what, detail)
        self.batch = None
        self.refs = []  # one TurboQuantKVCache per row
        self.snapshots = []  # (state tuple held, offset list, left_padding list, leaf bits)

    # constructors kept as methods so a test can substitute a broken cache class
    def new_batch(self, left_padding):
        c = self.cfg
        return self.tq.BatchTurboQuantKVCache(left_padding, c["bits"], seed=c["codec_seed"])

    def new_ref(self):
        c = self.cfg
        return self.tq.TurboQuantKVCache(c["bits"], seed=c["codec_seed"])

    def _tokens(self, rows, t):
        shape = (rows, self.cfg["heads"], t, self.cfg["dim"])
        k = self.rng.standard_normal(shape).astype(np.float32) * 2
        v = self.rng.standard_normal(shape).astype(np.float32)
        return k, v

    def _update(self, op, batch, refs, k, v, pad):
        """One update_and_fetch of `batch` with (k, v); row b's real tokens start at
        pad[b] within this chunk (tokens before are padding, fed with random content)."""
        mx = self.mx
        n = k.shape[2]
        mask = batch.make_mask(n, return_array=True)
        self._check_mask(op, batch, mask, n, refs, pad)
        kk, vv = batch.update_and_fetch(mx.array(k), mx.array(v))
        dk, dv = batch.dequantize(kk, vv)
        idx = batch._idx
        for b, ref in enumerate(refs):
            s = pad[b]
            if s < n:
                rk, rv = ref.update_and_fetch(mx.array(k[b:b + 1, :, s:]), mx.array(v[b:b + 1, :, s:]))
            if ref.keys is None:
                continue
            sk, sv = ref.dequantize()
            real = ref.offset
            for name, got, want in (("decode_k", dk, sk), ("decode_v", dv, sv)):
                g = np.array(got[b:b + 1, :, idx - real:idx])
                if g.shape != np.array(want).shape or not np.array_equal(_bits(g), _bits(want)):
                    self.record(op, name, f"row {b}: decoded over its {real} real tokens differs from the row alone")

    def _check_mask(self, op, batch, mask, n, refs, pad):
        """The mask a layer builds before the update: query i of row b (at _idx + i) sees
        exactly the row's real tokens up to itself, wherever the cache says the row
        starts (the start is the reference's: _idx less the tokens the row holds, or the
        chunk's own padding while it holds none). Padding queries are not judged."""
        idx = batch._idx
        m = np.array(mask)
        for b, ref in enumerate(refs):
            start = idx - ref.offset if ref.offset else idx + pad[b]
            mb = m[b if m.shape[0] > 1 else 0, 0]
            if mb.shape != (n, idx + n):
                self.record(op, "mask", f"row {b}: mask shape {mb.shape} for {n} queries at _idx {idx}")
                continue
            for i in range(max(0, start - idx), n):
                want = np.zeros(idx + n, bool)
                want[start:idx + i + 1] = True
                if not np.array_equal(mb[i], want):
                    self.record(op, "mask", f"row {b}: query {i} at _idx {idx} sees {np.nonzero(mb[i])[0].tolist()}, "
                                            f"its real tokens are {start}..{idx + i}")
                    break

    def check(self, op):
        """Codes and positions of every row against its reference; held snapshots."""
        batch, refs = self.batch, self.refs
        offs = np.array(batch.offset).tolist()
        lps = np.array(batch.left_padding).tolist()
        idx = batch._idx
        if len(offs) != len(refs) or len(lps) != len(refs):
            self.record(op, "rows", f"{len(offs)} offsets, {len(lps)} paddings for {len(refs)} rows")
            return
        state = batch.state
        if state[0] is not None:
            held = {a.shape[0] for _, a in _leaves(state[0]) + _leaves(state[1])}
            if held != {len(refs)}:
                self.record(op, "rows", f"the state holds {sorted(held)} rows, the batch {len(refs)}")
                raise Broken
        for b, ref in enumerate(refs):
            real = ref.offset
            if offs[b] != real or lps[b] != idx - real:
                self.record(op, "position", f"row {b}: offset {offs[b]}, left_padding {lps[b]} at _idx {idx}; "
                                            f"the row has {real} tokens")
            if real == 0 or state[0] is None:
                continue
            if idx < real:
                self.record(op, "codes", f"row {b}: _idx {idx} holds fewer than its {real} tokens")
                continue
            for which, got_s, want_s in (("k", state[0], ref.state[0]), ("v", state[1], ref.state[1])):
                for (name, g), (_, w) in zip(_leaves(got_s), _leaves(want_s)):
                    g = np.array(g[b:b + 1, :, idx - real:idx])
                    if g.shape != np.array(w).shape or not np.array_equal(_bits(g), _bits(w)):
                        self.record(op, "codes", f"row {b}: {which}.{name} over its {real} real tokens "
                                                 f"differs from the row alone")
                        break
            # extract(b): the row as a single-sequence cache, as the engine hands it out
            ex = batch.extract(b)
            if ex.offset != real:
                self.record(op, "extract", f"row {b}: extract holds {ex.offset} tokens, the row {real}")
            elif ex.keys is not None:
                for (name, g), (_, w) in zip(_leaves(ex.state[0]) + _leaves(ex.state[1]),
                                             _leaves(ref.state[0]) + _leaves(ref.state[1])):
                    if not np.array_equal(_bits(g), _bits(w)):
                        self.record(op, "extract", f"row {b}: extract's {name} differs from the row alone")
                        break
        for held, off, lp, leaves in self.snapshots:
            now = (np.array(held[2]).tolist(), np.array(held[3]).tolist())
            if now != (off, lp):
                self.record(op, "snapshot", f"a state taken with offset {off}, left_padding {lp} now reads "
                                            f"offset {now[0]}, left_padding {now[1]}")
            elif held[0] is not None and [np.array(a).tobytes() for _, a in _leaves(held[0])] != leaves:
                self.record(op, "snapshot", "a state taken earlier now holds other codes")
        self.snapshots = [s for s in self.snapshots if (np.array(s[0][2]).tolist(), np.array(s[0][3]).tolist())
                          == (s[1], s[2])]

    # ── the operations ────────────────────────────────────────────────────────────────

    def _prefilled(self, op, spec):
        lens = spec["lens"]
        total = max(lens)
        lp = [total - n for n in lens]
        batch = self.new_batch(lp)
        refs = [self.new_ref() for _ in lens]
        k, v = self._tokens(len(lens), total)
        at = 0
        for c in spec["chunks"]:
            pad = [max(0, p - at) for p in lp]
            self._update(op, batch, refs, k[:, :, at:at + c], v[:, :, at:at + c], pad)
            at += c
        for _ in range(spec["decode"]):
            k1, v1 = self._tokens(len(lens), 1)
            self._update(op, batch, refs, k1, v1, [0] * len(lens))
        return batch, refs

    def apply(self, o):
        op = o["op"]
        if op == "prefill":
            self.batch, self.refs = self._prefilled(op, o)
        elif op == "decode":
            for _ in range(o["n"]):
                k, v = self._tokens(len(self.refs), 1)
                self._update(op, self.batch, self.refs, k, v, [0] * len(self.refs))
        elif op == "filter":
            self.batch.filter(self.mx.array(o["keep"]))
            self.refs = [self.refs[i] for i in o["keep"]]
        elif op == "extend":
            other, refs = self._prefilled(op, o)
            self.batch.extend(other)
            self.refs += refs
        elif op == "extend_empty":
            # rows that hold no token yet (a batch made, not prefilled), merged on either
            # side: the engine's extend has a branch for each
            empty = self.new_batch([0] * o["rows"])
            fresh = [self.new_ref() for _ in range(o["rows"])]
            if o["side"] == "other":
                self.batch.extend(empty)
                self.refs += fresh
            else:
                empty.extend(self.batch)
                self.batch, self.refs = empty, fresh + self.refs
        elif op == "trim":
            # within the contract: a trim takes back tokens every row received (the
            # rejected drafts of a speculative step), so never more than the shortest row
            n = min([o["n"]] + [r.offset for r in self.refs])
            if n == 0:
                return
            got = self.batch.trim(n)
            if got != n:
                self.record(op, "trim", f"trim({n}) returned {got}")
            for r in self.refs:
                r.trim(n)
        elif op == "roundtrip":
            old = self.batch
            new = self.new_batch([0] * len(self.refs))
            new.state = old.state
            new.meta_state = old.meta_state
            new.key_codec, new.value_codec = None, None  # a loaded cache rebuilds them from the seed
            self.batch = new
        elif op == "snapshot":
            held = self.batch.state
            leaves = [] if held[0] is None else [np.array(a).tobytes() for _, a in _leaves(held[0])]
            self.snapshots.append((held, np.array(held[2]).tolist(), np.array(held[3]).tolist(), leaves))
        else:
            raise ValueError(f"unknown op {op!r}")
        self.check(op)


def run_plan(p, mx, tq, run_class=Run, stats=None):
    """Findings of one plan: a list of (op, what, detail). `stats` (a dict), if given,
    counts the operations run and judged, by op."""
    findings = []
    seen = set()

    def record(op, what, detail):
        if (op, what) not in seen:  # one line per (op, what) per sequence
            seen.add((op, what))
            findings.append((op, what, detail))

    r = run_class(mx, tq, p["config"], np.random.default_rng([p["seed"], 1]), record)
    for o in p["ops"]:
        try:
            r.apply(o)
            if stats is not None:
                stats[o["op"]] = stats.get(o["op"], 0) + 1
        except Broken:
            break
        except Exception as e:  # the engine raised (or the cache broke without a finding)
            record(o["op"], "raise", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            break
    return findings


class _Line:
    """A finding as the register matcher sees it (op and params, as a Problem has)."""

    def __init__(self, op, params):
        self.op, self.params = op, params
        self.line = op + " " + " ".join(f"{k}={v}" for k, v in params.items())


def _finding_line(p, op, what):
    c = p["config"]
    bits = c["bits"]
    return _Line(op, {"what": what, "dim": str(c["dim"]), "bits": f"{bits:g}", "seed": str(p["seed"])})


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvlab_mlx.turboquant_batch_replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True, help="the first sequence's seed")
    ap.add_argument("--count", type=int, default=1, help="sequences: seeds SEED .. SEED+COUNT-1")
    ap.add_argument("--only", type=int, help="one sequence, by its seed, printing its plan")
    ap.add_argument("--known", help="register of known divergences (kvlab_mlx/known.py format)")
    args = ap.parse_args(argv)
    mx, tq = _load()
    mx.set_default_device(mx.cpu)
    import importlib.metadata as md

    seeds = [args.only] if args.only is not None else list(range(args.seed, args.seed + args.count))
    print(f"turboquant_batch_replay: seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} sequences), "
          f"mlx {md.version('mlx')}, mlx-vlm {md.version('mlx-vlm')}")
    entries = known.read(args.known) if args.known else []
    t0 = time.monotonic()
    n_ops = 0
    ran = {}
    checks = {}
    unmatched = []
    for s in seeds:
        p = plan(s)
        n_ops += len(p["ops"])
        if args.only is not None:
            print(f"config {p['config']}")
            for o in p["ops"]:
                print(f"  {o}")
        found = run_plan(p, mx, tq, stats=ran)
        for op, what, detail in found:
            line = _finding_line(p, op, what)
            hit = [e for e in entries if e.matches(line)]
            for e in hit:
                e.hits.append(line.line)
            checks[(op, what)] = checks.get((op, what), 0) + 1
            tag = "KNOWN " + ",".join(e.note.rsplit("(", 1)[-1].rstrip(")") for e in hit) if hit else "DIVERGES"
            if not hit or args.only is not None:
                print(f"{tag} seed={s} {op} what={what}: {detail}")
                print(f"  repro: PYTHONPATH=adapters/mlx build/venv/bin/python -m kvlab_mlx.turboquant_batch_replay "
                      f"--seed {s} --only {s}")
            if not hit:
                unmatched.append(line.line)
    stale = [e for e in entries if not e.hits]
    for e in stale:
        print(f"STALE {e.where}: no finding matched '{e.filter}' ({e.note})")
    wall = time.monotonic() - t0
    summary = ", ".join(f"{op}/{what} in {n}" for (op, what), n in sorted(checks.items())) or "none"
    judged = ", ".join(f"{op} {n}" for op, n in sorted(ran.items()))
    print(f"{len(seeds)} sequences, {n_ops} operations drawn, {sum(ran.values())} run and judged ({judged}) "
          f"in {wall:.1f} s; divergent sequences per check: {summary}; "
          f"{len(unmatched)} unlisted, {len(stale)} stale")
    return 1 if unmatched or stale else 0


if __name__ == "__main__":
    sys.exit(main())
