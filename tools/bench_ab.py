#!/usr/bin/env python3
"""A/B timing of two kvlab_bench binaries on a noisy machine: is `new` faster than `old`?

  tools/bench_ab.py --old old/kvlab_bench --new build/ci/bench/kvlab_bench --rounds 6 -- \\
      --kvlab_cases=harness/cases/affine_quantize/perf --kvlab_backends=simd:AVX3_DL \\
      --kvlab_flush_mib=0 --benchmark_repetitions=5

(with KVLAB_THREADS=1 in the environment to time a kernel's arithmetic on one core).

Why: on these VMs the memory bandwidth drifts 2-3x within minutes, the host interferes,
and a process's stack/heap placement (ASLR) may decide whether some loads wait on stores
4 KiB away, so one run of each binary says little. This script runs the two binaries alternately, ABBA order
(old new, new old, ...) so a drift hits both alike, each run a fresh process; per process
and benchmark it keeps the fastest repetition (interference only ever adds time), and
across processes it compares those minima:
  * old / new: the median of the per-process minima, and their range;
  * change: new median / old median - 1;
  * p: the two-sided Mann-Whitney rank test of the two sets of minima (no distribution
    assumed; exact: every split of the pooled minima enumerated, midranks for ties);
  * verdict: "faster" / "slower" when p < --alpha (default 0.05) and |change| >= --min-pct
    (default 1 %), else "no clear change". With 6 processes a side the smallest possible
    p is 0.002; with 3 it is 0.1, so fewer than 4 a side never gives a verdict.
Rows present in only one binary's output are listed, not compared. A binary that fails
(exit status other than 0) stops the run with its output. Exit status: 0, or 1 with
--fail-on-slowdown when any row is "slower", 2 on bad usage or a failed run.

Python 3 standard library only.
"""

import argparse
import importlib.util
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile


def _load_bench_table():
    """tools/bench_table.py, beside this script: one rule for a row's name in both tools."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_table.py")
    spec = importlib.util.spec_from_file_location("kvlab_bench_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


row_name = _load_bench_table().base_name  # 'op/backend/shape/repeats:5/real_time' -> 'op/backend/shape'


def fastest_repetitions(result):
    """{benchmark: fastest repetition time in seconds} of one kvlab_bench JSON result
    (baselines left out: they time the machine, not the binary)."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    out = {}
    for b in result.get("benchmarks", []):
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        name = row_name(b.get("run_name", b["name"]))
        if name.startswith("baseline_"):
            continue
        t = b["real_time"] * units[b.get("time_unit", "ns")]
        out[name] = min(out.get(name, t), t)
    return out


def midranks(values):
    """Ranks 1..n of values, tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


EXACT_SPLITS = 1_000_000  # beyond this many splits, the normal approximation


def mann_whitney_p(a, b):
    """Two-sided p-value of the Mann-Whitney U test of samples a and b: the share of all
    ways to split the pooled values into groups of len(a) and len(b) whose rank sum lies at
    least as far from its mean as the observed one (midranks for ties); exact up to
    EXACT_SPLITS splits (6 + 6 processes: 924), else the normal approximation."""
    m, n = len(a), len(b)
    if m == 0 or n == 0:
        return 1.0
    ranks = midranks(list(a) + list(b))
    mean = m * (m + n + 1) / 2
    observed = abs(sum(ranks[:m]) - mean)
    if math.comb(m + n, m) > EXACT_SPLITS:
        sigma = math.sqrt(m * n * (m + n + 1) / 12)
        return math.erfc(observed / sigma / math.sqrt(2)) if sigma else 1.0
    extreme = total = 0
    for first in itertools.combinations(ranks, m):
        total += 1
        extreme += abs(sum(first) - mean) >= observed - 1e-9
    return extreme / total


def compare(old_runs, new_runs, alpha=0.05, min_pct=1.0):
    """Rows (name, old median, old range, new median, new range, change %, p, verdict) from
    per-process {benchmark: seconds} dicts, and the names present on one side only."""
    names_old = set().union(*old_runs) if old_runs else set()
    names_new = set().union(*new_runs) if new_runs else set()
    rows = []
    for name in sorted(names_old & names_new):
        a = [r[name] for r in old_runs if name in r]
        b = [r[name] for r in new_runs if name in r]
        ma, mb = statistics.median(a), statistics.median(b)
        change = 100 * (mb / ma - 1)
        p = mann_whitney_p(a, b)
        verdict = "no clear change"
        if p < alpha and abs(change) >= min_pct:
            verdict = "faster" if change < 0 else "slower"
        rows.append((name, ma, (min(a), max(a)), mb, (min(b), max(b)), change, p, verdict))
    return rows, sorted(names_old ^ names_new)


def run_once(binary, args, env):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        cmd = [binary, *args, f"--benchmark_out={path}", "--benchmark_out_format=json"]
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}:\n{done.stdout[-4000:]}")
        with open(path, encoding="utf-8") as f:
            return fastest_repetitions(json.load(f))
    finally:
        os.unlink(path)


def us(seconds):
    return f"{seconds * 1e6:.1f}"


def report(rows, one_sided, rounds, out=None):
    out = out or sys.stdout
    out.write(f"{rounds} processes a side, ABBA order; per process the fastest repetition; "
              "medians over processes (range), exact Mann-Whitney p\n")
    for name, ma, ra, mb, rb, change, p, verdict in rows:
        out.write(f"  {verdict:15s} {change:+6.1f}%  p={p:.3f}  old {us(ma)} us ({us(ra[0])}-{us(ra[1])})  "
                  f"new {us(mb)} us ({us(rb[0])}-{us(rb[1])})  {name}\n")
    for name in one_sided:
        out.write(f"  in one binary's output only: {name}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the baseline kvlab_bench binary")
    parser.add_argument("--new", required=True, help="the candidate kvlab_bench binary")
    parser.add_argument("--rounds", type=int, default=6, help="processes per binary (default 6)")
    parser.add_argument("--alpha", type=float, default=0.05, help="p below which a change counts (default 0.05)")
    parser.add_argument("--min-pct", type=float, default=1.0, help="smallest change that counts, in %% (default 1)")
    parser.add_argument("--fail-on-slowdown", action="store_true", help="exit 1 when a row is slower")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments both binaries get")
    a = parser.parse_args(argv)
    bench_args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if a.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {a.rounds}")
    for binary in (a.old, a.new):
        if not os.access(binary, os.X_OK):
            parser.error(f"{binary} is not an executable file")
    old_runs, new_runs = [], []
    try:
        for i in range(a.rounds):
            order = [(a.old, old_runs), (a.new, new_runs)]
            for binary, runs in (order if i % 2 == 0 else order[::-1]):
                runs.append(run_once(binary, bench_args, dict(os.environ)))
    except RuntimeError as e:
        sys.stderr.write(f"bench_ab: {e}\n")
        return 2
    rows, one_sided = compare(old_runs, new_runs, a.alpha, a.min_pct)
    report(rows, one_sided, a.rounds)
    return 1 if a.fail_on_slowdown and any(r[-1] == "slower" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
