#!/usr/bin/env python3
"""kvlab benchmark results: the ratio table of one run, the verdict of several runs, and the
comparison of two runs.

Reads Google Benchmark JSON written by kvlab_bench (bench/bench_suite.h), e.g.

  build/ci/bench/kvlab_bench --benchmark_repetitions=5 \\
      --benchmark_out=r.json --benchmark_out_format=json
  tools/bench_table.py table r.json
  tools/bench_table.py verdict r1.json r2.json r3.json
  tools/bench_table.py compare old.json new.json
  tools/bench_table.py passes r.json

table: one row per kernel benchmark: kernel | shape | backend | GB/s | % read | % memcpy |
  % vkcopy | arith floor | base drift | speed-up vs reference | target.
  * arith floor: the most the row's multiply-adds allow, in GB/s, and which bound is
    lower: arith or read. A SIMD decode row declares its multiply-add lanes per
    instruction (mix_fma_lanes, mix_bf16_dot_lanes, mix_u8_dot_lanes, mix_amx_int8_lanes,
    mix_s16_dot_lanes): its bytes over Σ lanes / the same run's lanes per second of
    baseline_fma, baseline_bf16dot, baseline_u8dot, baseline_amxint8 (AMX tile multiplies)
    and baseline_s16dot (vpdpwssd). Other
    rows: baseline_fma's lanes per second over their dense flop pairs per byte (the flops
    counter), as f32 FMAs.
  * GB/s = bytes model (bench/bytes_model.h: bytes read + bytes written, each once) /
    median wall time of the repetitions, in 10^9 bytes per second (Google Benchmark's
    console prints GiB/s).
  * % read, % memcpy: GB/s over the pool's read / memcpy bandwidth (memcpy counted as
    read + written, like every kernel, so a kernel at 100 % memcpy moves its bytes as fast
    as memcpy moves its own). Host rows only. Two bases, the header says which:
    - adjacent (a host row whose repetitions carry the counters adj_read_gbps and
      adj_memcpy_gbps: kvlab_bench samples both baselines right before and right after
      each repetition's timed loop, outside smoke runs): per repetition, its GB/s
      (bytes_per_iter / its wall time) over its own adjacent baseline; the column is the
      median of these ratios over the repetitions, and the target is judged on it. The
      machine's bandwidth drifts severalfold within minutes, so a kernel timed minutes
      after the run-start rows is read against the bandwidth it actually had. The header
      prints the range (min-max) of the adjacent read and memcpy over the run.
    - run-start (rows without those counters: older files, smoke runs, files with only
      aggregates): the median GB/s over the same run's baseline_read / baseline_memcpy rows
      with the pool's thread count.
  * base drift: the largest adj_drift of the row's repetitions, in % (how far a baseline
    moved across one timed loop: |after - before| / their mean, the larger of read and
    memcpy); "-" without adjacent samples. Above DRIFT_MARK_PCT (10 %) the target verdict
    says so, e.g. "PASS >= 50% memcpy (drift 23.0%)": the baseline moved during that
    benchmark, so its ratio is less certain. When the repetitions' own ratios lie on both
    sides of the target, the verdict (still the median's) adds "(uncertain: repetitions
    lo-hi%)": one more run may well flip it. kvlab_bench also samples the pool's FMA rate
    beside each repetition (adj_fma_glanes); where the median of those is below
    SLOWED_HOST_PCT (75 %) of the run's best (that sample or the run-start baseline_fma),
    the verdict adds "(host-slowed: its arithmetic N% of the run's best)": the host gave
    the pool less arithmetic while the row ran, so an arithmetic-bound row reads low.
  * % vkcopy: a Vulkan row's GB/s over the same run's device buffer copy on the same device,
    the faster of baseline_vkcopy/<device> (vkCmdCopyBuffer between device-local buffers)
    and baseline_vkshadercopy/<device> (a compute shader copying the same buffers), read +
    written, all timed on the device: on an NVIDIA H100 the copy command moved well under
    what the shader cores stream (bench/records/2026-11-26-nvidia-h100.md), so the command
    alone would flatter every kernel. Vulkan rows only; the host columns stay blank.
    A Vulkan row whose calls were not all timed on the device (a kernel of several
    submissions, timed by the host's wall clock: an upper bound) is marked "(wall)" and
    its target is not judged.
  * speed-up: the reference's median time on the same problem over this backend's; and,
    for each peer engine timed in the same run (PEERS: mlx, ggml), "vs <peer>" likewise; a
    quantized_sdpa row is paired with the peer's row of the same shape whose K and V have
    the same element bits and bits per element (bench_results.peer_key: ggml's q8_0 / q4_0
    beside kvlab's affine 8-bit / 4-bit g64, 8.5 / 4.5 bits each).
  * target: the issue's bandwidth targets, PASS or MISS with the measured ratio:
      quantized_sdpa B=1 Hq=32 Hkv=8 Lq=1 Lk=32768 or 65536 D=128 f16, affine group 64,
        K and V at 8 bits: >= 80 % read (SIMD code without AVX-512: >= 65 %); a side at
        4 bits: >= 70 % (without AVX-512: >= 50 %); backends other than SIMD: >= 80 %
      sdpa decode (Lq=1), Lk >= 32768: >= 80 % read
      affine_quantize >= 70 % memcpy;  rope, kv_scatter (append) >= 80 % memcpy
      fp_quantize, fp_dequantize (mxfp4, mxfp8, nvfp4) >= 50 % memcpy
    They apply to the optimized host backends, not to the reference. On a Vulkan GPU:
      quantized_sdpa decode (Lq=1), affine K and V, Lk >= 32768: >= 70 % vkcopy
    A Vulkan device of type cpu (lavapipe) is not a target: "lavapipe: not a target".

verdict: each target (the best optimized backend per kernel, shape and basis, as `table`
  judges it) over several runs of the same command: one column per run with its %, "?"
  after a run whose repetitions fall on both sides of the target. PASS only when the target
  is met in every run and there are at least --runs (default 3: issue 20's "three
  consecutive full runs") runs, all from one machine (same kvlab_cpu, CPU count, threads,
  best SIMD target and cache flush in the context); otherwise MISS (met in none), MIXED
  (met in some), ABSENT (not in every run), "PASS in N runs, fewer than 3", or RERUN when
  every run that missed was host-slowed ("!" after its %): those runs say nothing about
  the CPU either way, so the command has to run again. Exit status 0 when every target
  passes, 1 otherwise.

compare: rows present in both files, matched by name. Noise rule: a row is flagged only
  when  |median_new - median_old| > K * max(noise_old, noise_new)  AND the change exceeds
  MIN_PCT percent of the old median, where a run's noise is 1.4826 * MAD of its repetition
  times (a robust standard deviation), or the stddev aggregate when the file holds only
  aggregates. Rows with fewer than 3 repetitions on either side have no noise estimate and
  are listed as not compared (by default the reference runs once). Defaults: K = 3,
  MIN_PCT = 3. Exit status 0, or 1 with --fail-on-change (any flagged change) or
  --fail-on-slowdown (a flagged slowdown). The rule compares times only; when the files
  carry adjacent baselines, a note gives each run's adjacent memcpy range, so a change
  that came with a moving machine is visible.

Python 3 standard library only.
"""

import argparse
import os
import statistics
import sys

# The result files' reading and the targets live beside this script (bench_results.py).
# This script is also loaded by path (tests/bench/test_bench_table.py, tools/bench_ab.py),
# so its own folder goes on the import path first. UNIT_SECONDS, base_name and
# parse_label are here for those callers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_results import (  # noqa: E402  pylint: disable=wrong-import-position
    DEVICE_COPIES, DOT_BASELINES, DRIFT_MARK_PCT, MIN_REPS_FOR_NOISE, MIX_KINDS, MIX_NAMES, NOT_A_TARGET, PEERS,
    SLOWED_HOST_PCT, UNIT_SECONDS, ResultError, peer_key,
    adjacent_range, base_name, baselines, device_key, device_type, is_vulkan, load, parse_label, target_of)


def fmt(x, spec, missing="-"):
    """x in `spec`, or 3 significant digits where `spec` would print a small non-zero x as 0."""
    if x is None:
        return missing
    text = format(x, spec)
    if x != 0 and float(text) == 0:
        return format(x, ".3g")
    return text


def print_table(rows_out, headers, out, left=3):
    """Columns padded to their widest cell; the first `left` flush left, the others right."""
    widths = [max(len(str(r[i])) for r in [headers] + rows_out) for i in range(len(headers))]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out.write(line.rstrip() + "\n" + "  ".join("-" * w for w in widths) + "\n")
    for r in rows_out:
        out.write("  ".join(str(c).ljust(w) if i < left else str(c).rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() + "\n")


class Bases:
    """The run-start bandwidths of one file: the pool's read and memcpy GB/s (None where the
    file has no such row) and, per Vulkan device, the faster of its two copies."""

    def __init__(self, rows):
        self.rows = baselines(rows)
        read, copy = self.rows.get(("baseline_read", "pool")), self.rows.get(("baseline_memcpy", "pool"))
        self.read = read.gbps() if read else None
        self.copy = copy.gbps() if copy else None
        fma = self.rows.get(("baseline_fma", "pool"))
        self.fma = statistics.median(fma.fma_lanes_per_second) if fma and fma.fma_lanes_per_second else None
        # Lanes per second of each instruction a row may declare its multiply-adds by.
        self.rates = {"fma": self.fma}
        for op in DOT_BASELINES:
            r = self.rows.get((op, "pool"))
            for kind, values in (r.dot_lanes_per_second.items() if r else ()):
                self.rates[kind] = statistics.median(values)
        # The host's best arithmetic in this run (1e9 FMA lanes/s): the run-start pool row
        # and every sample beside a row; host_arith_pct reads each row against it.
        self.fma_samples = [g for r in rows.values() for g in r.adjacent_fma]
        self.best_fma_glanes = max(self.fma_samples + ([self.fma / 1e9] if self.fma else []), default=None)
        self.device_copy = {}
        for (op, where), r in self.rows.items():
            if op in DEVICE_COPIES and r.gbps():
                self.device_copy[where] = max(self.device_copy.get(where, 0.0), r.gbps())

    def arith_floor(self, r):
        """(the arithmetic floor of a host row in GB/s, the bound that governs: 'arith' or
        'read', what the floor counts), or (None, None, None). A row that declares its
        multiply-adds by instruction (SIMD decode rows: mix counters) needs Σ lanes/rate of
        this run's baselines per call; any other row is credited its dense flops as f32 FMAs,
        one lane per flop pair (sdpa: 2·(Dk + Dv) flops per key row). The bound is whichever
        of the floor and the adjacent read is lower."""
        if is_vulkan(r.backend):
            return None, None, None
        if r.mix and r.bytes_per_iter:
            used = [k for k in MIX_KINDS if r.mix.get(k)]
            if not used or any(not self.rates.get(k) for k in used):
                return None, None, None
            floor = r.bytes_per_iter / sum(r.mix[k] / self.rates[k] for k in used) / 1e9
            what = " + ".join(MIX_NAMES[k] for k in used)
        else:
            per_byte = r.flops_per_byte()
            if not self.fma or not per_byte:
                return None, None, None
            floor, what = 2 * self.fma / per_byte / 1e9, "dense f32 FMAs"
        read = r.read_gbps() or self.read
        return floor, ("arith" if read and floor < read else "read"), what

    def slowed(self, r):
        """The host's arithmetic beside row r in % of the run's best where it is below
        SLOWED_HOST_PCT (the row is host-slowed), else None."""
        arith = r.host_arith_pct(self.best_fma_glanes)
        return arith if arith is not None and arith < SLOWED_HOST_PCT else None

    def ratios(self, r):
        """(% read, % memcpy, % vkcopy, base drift %) of a timed row (None where not defined)."""
        g = r.gbps()
        pr = pc = pd = drift = None
        if is_vulkan(r.backend):
            dev = self.device_copy.get(device_key(r.backend))
            pd = 100 * g / dev if g is not None and dev else None
        elif (adjacent := r.adjacent_pct()) is not None:
            pr, pc = adjacent
            drift = r.drift_pct()
        else:
            pr = 100 * g / self.read if g is not None and self.read else None
            pc = 100 * g / self.copy if g is not None and self.copy else None
        return pr, pc, pd, drift


class Judged:
    """A row measured against its target: `got` % of `basis` where `need` % is asked;
    `uncertain` when its repetitions fall on both sides; `slowed` the host's arithmetic in %
    of the run's best where it was below SLOWED_HOST_PCT, else None; `marks` the notes."""

    def __init__(self, row, basis, need, got, marks, uncertain, slowed=None):
        self.row, self.basis, self.need, self.got, self.marks, self.uncertain = row, basis, need, got, marks, uncertain
        self.slowed = slowed

    @property
    def passed(self):
        return self.got >= self.need


def judge(context, r, ratios, bases):
    """(the target column's text, a Judged or None) of a timed row."""
    t = target_of(r)
    if not t:
        return "", None
    pr, pc, pd, drift = ratios
    basis, need = t
    got = {"read": pr, "memcpy": pc, "vkcopy": pd}[basis]
    kind = device_type(context, r.backend) if is_vulkan(r.backend) else None
    if kind == "cpu":
        return NOT_A_TARGET, None
    if r.wall_timed():
        return f"? >= {need:g}% {basis} (wall clock)", None
    if got is None or (is_vulkan(r.backend) and kind is None):
        return f"? >= {need:g}% {basis}", None
    marks = f" (drift {drift:.1f}%)" if drift is not None and drift > DRIFT_MARK_PCT else ""
    spread = r.repetition_pcts(basis, {"read": bases.read, "memcpy": bases.copy}.get(basis))
    uncertain = len(spread) > 1 and min(spread) < need <= max(spread)
    if uncertain:
        # The median decides, but the repetitions themselves fall on both sides.
        marks += f" (uncertain: repetitions {min(spread):.1f}-{max(spread):.1f}%)"
    slowed = bases.slowed(r)
    if slowed is not None:
        marks += f" (host-slowed: its arithmetic {slowed:.0f}% of the run's best)"
    judged = Judged(r, basis, need, got, marks, uncertain, slowed)
    return f"{'PASS' if judged.passed else 'MISS'} >= {need:g}% {basis}{marks}", judged


def best_per_target(judged):
    """Per (kernel, shape, basis): the Judged of the backend that came closest (the best
    optimized backend is the one a target is met or missed by)."""
    best = {}
    for j in judged:
        key = (j.row.op, j.row.shape, j.basis)
        if key not in best or j.got > best[key].got:
            best[key] = j
    return best


def table(path, out=sys.stdout):
    context, rows = load(path)
    bases = Bases(rows)
    base = bases.rows
    out.write(f"{path}: {context.get('date', '')}, {context.get('kvlab_threads', '?')} threads, "
              f"best SIMD target {context.get('kvlab_simd_best_target', '?')}, "
              f"cache flush {context.get('kvlab_flush_mib', '?')} MiB before each timed call\n")
    if "kvlab_cpu" in context:
        out.write(f"  CPU: {context['kvlab_cpu']}\n")
    for (op, where), r in sorted(base.items()):
        extra = ""
        if op == "baseline_fma":
            lanes = statistics.median(r.fma_lanes_per_second) / 1e9 if r.fma_lanes_per_second else None
            out.write(f"  {op:21s} {where:6s} {r.shape:24s} {fmt(lanes, '.1f')} G f32 FMA lanes/s\n")
            continue
        if op in DOT_BASELINES:
            for kind, values in r.dot_lanes_per_second.items():
                out.write(f"  {op:21s} {where:6s} {r.shape:24s} {statistics.median(values) / 1e9:.1f} G "
                          f"{MIX_NAMES[kind]} lanes/s\n")
            continue
        if op == "baseline_memcpy" and r.gbps():
            extra = f"  ({r.gbps() / 2:.1f} GB/s copied)"
        if op in DEVICE_COPIES:
            kind = device_type(context, where)
            extra += f"  on {context.get('kvlab_vulkan_device:' + where, 'an unknown device')}"
            if kind == "cpu":
                extra += f"  ({NOT_A_TARGET})"
        out.write(f"  {op:21s} {where:6s} {r.shape:24s} {fmt(r.gbps(), '.1f')} GB/s{extra}\n")
    if "kvlab_vulkan_clock" in context:
        out.write(f"  Vulkan kernels timed by: {context['kvlab_vulkan_clock']}\n")
    mib = context.get("kvlab_baseline_mib")
    if mib is not None and int(mib) < 256:
        out.write(f"  note: baselines over {mib} MiB, below the 256 MiB the targets assume\n")
    host = [r for r in rows.values() if not r.op.startswith("baseline_") and r.timed and not is_vulkan(r.backend)]
    run_start_rows = [r for r in host if not r.adjacent]
    ranges = adjacent_range(rows)
    if ranges:
        (read_lo, read_hi), (copy_lo, copy_hi) = ranges
        out.write("  % read / % memcpy basis: adjacent samples per benchmark (read and memcpy right before and "
                  "after each repetition's timed loop; median of the per-repetition ratios)\n")
        out.write(f"  adjacent samples over the run: read {read_lo:.1f}-{read_hi:.1f} GB/s, "
                  f"memcpy {copy_lo:.1f}-{copy_hi:.1f} GB/s\n")
        fma = bases.fma_samples
        if fma:
            slowed = sum(1 for r in host if bases.slowed(r) is not None)
            out.write(f"  the pool's FMA rate beside them: {min(fma):.1f}-{max(fma):.1f} G lanes/s; "
                      f"{slowed} row(s) host-slowed (below {SLOWED_HOST_PCT:g}% of the best)\n")
        if run_start_rows:
            out.write(f"  host rows without adjacent samples ({len(run_start_rows)}): over the run-start rows above\n")
    else:
        out.write("  % read / % memcpy basis: the run-start baseline rows above (no adjacent samples in this file)\n")
    if (bases.read is None or bases.copy is None) and (run_start_rows or not ranges):
        out.write("  note: no pool baseline rows in this file: % columns and targets are blank\n")

    # Targets are about DRAM-sized perf shapes; the smoke tier only proves the suites run.
    judging = context.get("kvlab_tier", "perf") != "smoke"
    if not judging:
        out.write("  note: smoke tier (tiny shapes, one iteration): targets are not evaluated\n")
    reference = {(r.op, r.shape): r for r in rows.values() if r.backend == "reference" and r.timed}
    # A peer's rows by peer_key; a key two of its rows share pairs with neither.
    peer_rows = {}
    for r in rows.values():
        if r.timed and r.backend in PEERS:
            k = (r.backend, peer_key(r))
            peer_rows[k] = None if k in peer_rows else r
    peers_present = [p for p in PEERS if any(r.backend == p for r in rows.values() if r.timed)]
    lines, verdicts, untimed = [], [], []
    for r in rows.values():
        if r.op.startswith("baseline_"):
            continue
        if not r.timed:
            untimed.append(r)
            continue
        g = r.gbps()
        ratios = bases.ratios(r)
        pr, pc, pd, drift = ratios
        ref = reference.get((r.op, r.shape))
        speedup = ref.median() / r.median() if ref and r.backend != "reference" else None
        vs_peers = []
        for peer in peers_present:
            other = peer_rows.get((peer, peer_key(r)))
            x = other.median() / r.median() if other and r.backend != peer and other.median() else None
            vs_peers.append(fmt(x, ".1f", "-") + ("x" if x else ""))
        verdict = ""
        if judging:
            verdict, judged = judge(context, r, ratios, bases)
            if judged:
                verdicts.append(judged)
        reps = len(r.times) if r.times else "agg"
        floor, bound, _ = bases.arith_floor(r)
        lines.append([r.op, r.shape, r.backend, fmt(g, ".2f") + (" (wall)" if r.wall_timed() else ""),
                      fmt(pr, ".1f"), fmt(pc, ".1f"), fmt(pd, ".1f"),
                      fmt(floor, ".1f") + (f" {bound}" if bound else ""),
                      fmt(drift, ".1f") + ("%" if drift is not None else ""),
                      fmt(speedup, ".1f", "-") + ("x" if speedup else ""), *vs_peers, reps, verdict])
    print_table(lines, ["kernel", "shape", "backend", "GB/s", "% read", "% memcpy", "% vkcopy", "arith floor",
                        "base drift", "vs ref",
                        *[f"vs {p}" for p in peers_present], "reps", "target"], out)
    if verdicts:
        out.write("\ntargets (best optimized backend per kernel, shape and baseline):\n")
        for (op, shape, _), j in best_per_target(verdicts).items():
            status = "PASS" if j.passed else f"MISS by {fmt(j.need - j.got, '.1f')} points"
            floor, bound, what = bases.arith_floor(j.row)
            read = j.row.read_gbps() or bases.read
            if not j.passed and floor and read and j.basis == "read":
                status += (f"; {what} alone allow {floor:.1f} GB/s = {100 * floor / read:.0f}% of read "
                           f"({'arithmetic' if bound == 'arith' else 'bandwidth'}-bound)")
            out.write(f"  {op} {shape} [{j.row.backend}]: {j.got:.1f}% of {j.basis} (target {j.need:g}%): "
                      f"{status}{j.marks}\n")
    if untimed:
        out.write("\nnot timed:\n")
        by_reason = {}
        for r in untimed:
            by_reason.setdefault((r.error or "no timing").splitlines()[0], []).append(r)
        for reason, rs in sorted(by_reason.items()):
            out.write(f"  {len(rs)}x {reason}  (e.g. {rs[0].name})\n")
    return 0


# What a verdict over several runs compares between the files: a PASS must hold on one
# machine, for one command, in consecutive runs.
SAME_MACHINE = ("kvlab_cpu", "num_cpus", "kvlab_threads", "kvlab_simd_best_target", "kvlab_flush_mib")


def verdict(paths, runs=3, out=sys.stdout):
    """Each target over several result files: PASS only when it is met in every file and
    there are at least `runs` files (issue 20: three consecutive full runs of the same
    command, the machine otherwise idle). Exit 0 when every target passes, else 1."""
    files = []
    for path in paths:
        context, rows = load(path)
        bases = Bases(rows)
        judged = []
        for r in rows.values():
            if r.timed and not r.op.startswith("baseline_") and context.get("kvlab_tier", "perf") != "smoke":
                judged.append(judge(context, r, bases.ratios(r), bases)[1])
        files.append((path, context, best_per_target(j for j in judged if j)))
    out.write(f"verdict over {len(files)} run(s); a PASS needs the target met in each of at least {runs}\n")
    for i, (path, context, _) in enumerate(files, 1):
        out.write(f"  run {i}: {path}: {context.get('date', '?')}, {context.get('kvlab_cpu', 'CPU not recorded')}, "
                  f"{context.get('kvlab_threads', '?')} threads\n")
    problems = []
    for key in SAME_MACHINE:
        values = {str(c.get(key, "(not recorded)")) for _, c, _ in files}
        if len(values) > 1:
            problems.append(f"the runs differ in {key}: {', '.join(sorted(values))}")
    unrecorded = sum(1 for _, c, _ in files if "kvlab_cpu" not in c)
    if unrecorded:
        out.write(f"  note: {unrecorded} run(s) do not record their CPU (older kvlab_bench): "
                  "that every run had the same CPU is not checked\n")
    keys = []
    for _, _, best in files:
        keys += [k for k in best if k not in keys]
    if not keys:
        problems.append("no row of these files has a target (smoke tier, or no perf shapes)")
    lines, all_pass = [], not problems and len(files) >= runs
    for key in keys:
        cells, met, present, need, basis, slowed = [], 0, 0, None, key[2], []
        for i, (_, _, best) in enumerate(files, 1):
            j = best.get(key)
            if j is None:
                cells.append("-")
                continue
            present += 1
            met += j.passed
            need = j.need
            if not j.passed and j.slowed is not None:
                slowed.append(f"run {i} at {j.slowed:.0f}%")
            cells.append(f"{j.got:.1f}{'?' if j.uncertain else ''}{'!' if j.slowed is not None else ''}")
        if present < len(files):
            status = f"ABSENT from {len(files) - present} of {len(files)} runs"
        elif met == len(files):
            status = "PASS" if len(files) >= runs else f"PASS in {met} runs, fewer than {runs}"
        elif met + len(slowed) == len(files):
            # Missed only where the host gave the pool less arithmetic: no verdict on this
            # CPU from those runs (neither met nor missed); run the command again.
            status = f"RERUN: missed only host-slowed ({', '.join(slowed)})"
        elif met == 0:
            status = "MISS"
        else:
            status = f"MIXED: met in {met} of {len(files)}"
        all_pass = all_pass and status == "PASS"
        lines.append([key[0], key[1], *cells, f">= {need:g}% {basis}", status])
    print_table(lines, ["kernel", "shape", *[f"run {i}" for i in range(1, len(files) + 1)], "target", "verdict"], out,
                left=2)
    out.write("  ? = that run's repetitions fall on both sides of the target (its median decides)\n")
    out.write(f"  ! = host-slowed: the FMA rate sampled beside the row below {SLOWED_HOST_PCT:g}% of the run's best\n")
    for p in problems:
        out.write(f"  not a PASS: {p}\n")
    if len(files) < runs:
        out.write(f"  not a PASS: {len(files)} run(s), fewer than the {runs} a PASS needs\n")
    out.write(f"{'every target PASSES' if all_pass else 'not every target passes'} "
              f"({sum(1 for l in lines if l[-1] == 'PASS')} of {len(lines)} in every run)\n")
    return 0 if all_pass else 1


def compare_rows(old, new, k=3.0, min_pct=3.0):
    """Returns (flagged, quiet, not_compared): flagged rows are (name, old, new, pct, noise_pct)."""
    flagged, quiet, not_compared = [], 0, []
    for name in sorted(set(old) & set(new)):
        a, b = old[name], new[name]
        if not a.timed or not b.timed:
            continue
        na, nb = a.noise(), b.noise()
        if na is None or nb is None:
            not_compared.append(name)
            continue
        ma, mb = a.median(), b.median()
        delta = mb - ma
        noise = max(na, nb)
        pct = 100 * delta / ma
        if abs(delta) > k * noise and abs(pct) > min_pct:
            flagged.append((name, ma, mb, pct, 100 * noise / ma))
        else:
            quiet += 1
    return flagged, quiet, not_compared


def compare(old_path, new_path, k, min_pct, fail_on_change, fail_on_slowdown, out=sys.stdout):
    _, old = load(old_path)
    _, new = load(new_path)
    flagged, quiet, not_compared = compare_rows(old, new, k, min_pct)
    out.write(f"rule: flagged when |delta median| > {k:g} x max(noise old, noise new) and > {min_pct:g}%\n")
    for name, ma, mb, pct, noise_pct in flagged:
        kind = "SLOWER" if pct > 0 else "faster"
        out.write(f"  {kind:6s} {pct:+7.1f}%  (noise {noise_pct:.1f}%)  {ma * 1e6:.1f} us -> {mb * 1e6:.1f} us  {name}\n")
    if any(n.startswith("baseline_") for n, *_ in flagged):
        out.write("  note: a memory baseline moved: the machine's bandwidth changed between the runs, "
                  "so compare the % read / % memcpy columns of `table` too\n")
    old_range, new_range = adjacent_range(old), adjacent_range(new)
    if old_range or new_range:
        def memcpy_range(r):
            return f"{r[1][0]:.1f}-{r[1][1]:.1f} GB/s" if r else "not sampled"
        out.write(f"  note: adjacent memcpy baseline over the old run {memcpy_range(old_range)}, over the new run "
                  f"{memcpy_range(new_range)}; the rule compares times only, `table` reads each row against "
                  "its own baselines\n")
    out.write(f"{len(flagged)} flagged, {quiet} within noise, {len(not_compared)} without a noise estimate "
              f"(< {MIN_REPS_FOR_NOISE} repetitions)\n")
    only = sorted(set(old) ^ set(new))
    if only:
        out.write(f"{len(only)} benchmarks in only one file (e.g. {only[0]})\n")
    if fail_on_change and flagged:
        return 1
    if fail_on_slowdown and any(f[3] > 0 for f in flagged):
        return 1
    return 0


def passes(path, out=sys.stdout):
    """Each device-timed row's passes (counters us:<pass>, the call's commands summed by
    shader name): median µs per call over the repetitions and its share of the row's
    median time. Returns 1 when no row has them (not a device run, or an older file)."""
    _, rows = load(path)
    body = []
    for name in sorted(rows):
        r = rows[name]
        total = r.median()
        for p in sorted(r.passes, key=lambda p: -statistics.median(r.passes[p])):
            us = statistics.median(r.passes[p])
            share = 100 * us * 1e-6 / total if total else None
            body.append([r.op, r.shape, r.backend, p, fmt(us, ".1f"), fmt(share, ".1f")])
    if not body:
        out.write(f"{path}: no row carries per-pass device times (us:<pass> counters of a Vulkan run)\n")
        return 1
    print_table(body, ["kernel", "shape", "backend", "pass", "µs", "% of call"], out, left=4)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="ratio table of one result file")
    t.add_argument("result")
    v = sub.add_parser("verdict", help="each target over several runs: PASS only where met in every run")
    v.add_argument("results", nargs="+")
    v.add_argument("--runs", type=int, default=3, help="runs a PASS needs (default 3, the issue's rule)")
    c = sub.add_parser("compare", help="changes beyond the measured noise between two result files")
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument("--k", type=float, default=3.0, help="noise multiple a change must exceed (default 3)")
    c.add_argument("--min-pct", type=float, default=3.0, help="minimum change in percent (default 3)")
    c.add_argument("--fail-on-change", action="store_true", help="exit 1 when any change is flagged")
    c.add_argument("--fail-on-slowdown", action="store_true", help="exit 1 when a slowdown is flagged")
    p = sub.add_parser("passes", help="device time per pass of each Vulkan row (where the GPU spends a call)")
    p.add_argument("result")
    args = parser.parse_args(argv)
    try:
        if args.command == "table":
            return table(args.result)
        if args.command == "verdict":
            return verdict(args.results, args.runs)
        if args.command == "passes":
            return passes(args.result)
        return compare(args.old, args.new, args.k, args.min_pct, args.fail_on_change, args.fail_on_slowdown)
    except (ResultError, OSError) as e:
        sys.stderr.write(f"bench_table: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
