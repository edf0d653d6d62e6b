"""The rules of tools/bench_ab.py: its rank test against hand-counted p-values, its
verdicts, and whole runs over stand-in binaries (small scripts that write a kvlab_bench
JSON result with chosen times). Run by CTest as bench.ab_rules; KVLAB_BENCH_AB names the
script, else it is found beside this directory."""

import importlib.util
import io
import json
import os
import stat
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

SCRIPT = os.environ.get("KVLAB_BENCH_AB",
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench_ab.py"))
spec = importlib.util.spec_from_file_location("bench_ab", SCRIPT)
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)


class RankTest(unittest.TestCase):
    def test_complete_separation_is_the_smallest_p(self):
        # 6 + 6: of the C(12, 6) = 924 splits only the observed one and its mirror are as
        # extreme: p = 2/924. 3 + 3: 2/20 = 0.1, never below 0.05.
        self.assertAlmostEqual(ab.mann_whitney_p([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]), 2 / 924)
        self.assertAlmostEqual(ab.mann_whitney_p([4, 5, 6], [1, 2, 3]), 0.1)

    def test_interleaved_samples_are_far_from_significant(self):
        # a = ranks 1, 3, 5, 7: rank sum 16 against a mean of 18. Of the 70 four-of-eight
        # subsets, 7 sum to 17, 8 to 18 and 7 to 19; the other 48 lie 2 or more from 18:
        # p = 48/70.
        self.assertAlmostEqual(ab.mann_whitney_p([1, 3, 5, 7], [2, 4, 6, 8]), 48 / 70)

    def test_ties_share_their_ranks(self):
        self.assertEqual(ab.midranks([5, 1, 5, 3]), [3.5, 1.0, 3.5, 2.0])
        self.assertEqual(ab.mann_whitney_p([2, 2, 2], [2, 2, 2]), 1.0)

    def test_many_processes_use_the_normal_approximation(self):
        # 13 + 13 = 10 400 600 splits: approximated; complete separation is far below 0.05.
        p = ab.mann_whitney_p(list(range(13)), list(range(100, 113)))
        self.assertLess(p, 1e-4)


class Verdicts(unittest.TestCase):
    def test_a_separated_shift_beyond_the_minimum_is_a_verdict(self):
        old = [{"k": t} for t in (1.00, 1.01, 1.02, 1.03)]
        new = [{"k": t} for t in (0.90, 0.91, 0.92, 0.93)]
        rows, only = ab.compare(old, new)
        name, ma, _, mb, _, change, p, verdict = rows[0]
        self.assertEqual((name, verdict, only), ("k", "faster", []))
        self.assertAlmostEqual(change, 100 * (0.915 / 1.015 - 1))
        self.assertAlmostEqual(p, 2 / 70)
        rows, _ = ab.compare(new, old)
        self.assertEqual(rows[0][-1], "slower")

    def test_overlapping_or_tiny_changes_are_no_verdict(self):
        old = [{"k": t} for t in (1.00, 1.02, 1.04, 1.06)]
        new = [{"k": t} for t in (1.01, 1.03, 1.05, 1.07)]
        self.assertEqual(ab.compare(old, new)[0][0][-1], "no clear change")
        # Fully separated but 0.5 %: below the 1 % minimum.
        old = [{"k": t} for t in (1.000, 1.001, 1.002, 1.003)]
        new = [{"k": t} for t in (1.006, 1.007, 1.008, 1.009)]
        self.assertEqual(ab.compare(old, new)[0][0][-1], "no clear change")

    def test_rows_of_one_side_only_are_listed(self):
        rows, only = ab.compare([{"a": 1.0, "b": 1.0}], [{"a": 1.0, "c": 1.0}])
        self.assertEqual([r[0] for r in rows], ["a"])
        self.assertEqual(only, ["b", "c"])

    def test_each_process_keeps_its_fastest_repetition_and_baselines_are_left_out(self):
        result = {"benchmarks": [
            {"name": "k/x/real_time", "run_name": "k/x/min_time:0.200/real_time", "run_type": "iteration",
             "real_time": t, "time_unit": "us"} for t in (30.0, 10.0, 20.0)] + [
            {"name": "k/x_median", "run_name": "k/x/real_time", "run_type": "aggregate", "real_time": 1.0,
             "time_unit": "us"},
            {"name": "baseline_read/pool", "run_name": "baseline_read/pool", "run_type": "iteration",
             "real_time": 5.0, "time_unit": "ms"}]}
        fastest = ab.fastest_repetitions(result)
        self.assertEqual(list(fastest), ["k/x"])
        self.assertAlmostEqual(fastest["k/x"], 10.0e-6)


# A stand-in for kvlab_bench: appends its tag to LOG, then writes a result whose one row
# takes the next time of its list (seconds), cycling.
FAKE = """#!{python}
import json, sys
tag, times, log = {tag!r}, {times!r}, {log!r}
with open(log, "a") as f:
    f.write(tag + "\\n")
runs = sum(1 for line in open(log) if line.strip() == tag) - 1
if {fail!r}:
    print("verification FAILED"); sys.exit(1)
out = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--benchmark_out="))
t = times[runs % len(times)]
rows = [{{"name": "op/simd:X/s", "run_name": "op/simd:X/s/real_time", "run_type": "iteration",
          "real_time": t * 1e3, "time_unit": "ms"}}]
json.dump({{"context": {{}}, "benchmarks": rows}}, open(out, "w"))
"""


class WholeRuns(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.log = os.path.join(self.dir.name, "log")

    def tearDown(self):
        self.dir.cleanup()

    def fake(self, tag, times, fail=False):
        path = os.path.join(self.dir.name, tag)
        with open(path, "w") as f:
            f.write(FAKE.format(python=sys.executable, tag=tag, times=times, log=self.log, fail=fail))
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        return path

    def run_ab(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = ab.main(list(argv))
        return status, out.getvalue(), err.getvalue()

    def test_abba_order_and_a_slowdown_verdict(self):
        old = self.fake("old", [0.010, 0.011, 0.012, 0.013])
        new = self.fake("new", [0.020, 0.021, 0.022, 0.023])
        status, text, _ = self.run_ab("--old", old, "--new", new, "--rounds", "4", "--fail-on-slowdown", "--",
                                      "--kvlab_ops=op")
        with open(self.log) as f:
            self.assertEqual(f.read().split(), ["old", "new", "new", "old", "old", "new", "new", "old"])
        self.assertIn("slower", text)
        self.assertIn("p=0.029", text)
        self.assertIn("old 11500.0 us (10000.0-13000.0)", text)
        self.assertEqual(status, 1)

    def test_a_failing_binary_stops_the_run_with_its_output(self):
        old = self.fake("old", [0.01])
        bad = self.fake("bad", [0.01], fail=True)
        status, _, err = self.run_ab("--old", old, "--new", bad, "--rounds", "2")
        self.assertEqual(status, 2)
        self.assertIn("exited with 1", err)
        self.assertIn("verification FAILED", err)

    def test_a_missing_binary_is_a_usage_error_naming_it(self):
        err = io.StringIO()
        with redirect_stderr(err), self.assertRaises(SystemExit) as e:
            ab.main(["--old", "/nonexistent/kvlab_bench", "--new", "/nonexistent/kvlab_bench"])
        self.assertEqual(e.exception.code, 2)
        self.assertIn("/nonexistent/kvlab_bench is not an executable file", err.getvalue())


if __name__ == "__main__":
    unittest.main()
