"""The rules of tools/bench_table.py on synthetic result files whose answers are derived
by hand in the comments (run by CTest as bench.table_rules; KVLAB_BENCH_TABLE names the
script, else it is found beside this directory)."""

import atexit
import importlib.util
import io
import json
import os
import tempfile
import unittest

SCRIPT = os.environ.get("KVLAB_BENCH_TABLE",
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "bench_table.py"))
spec = importlib.util.spec_from_file_location("bench_table", SCRIPT)
bt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bt)

QSDPA8 = ("quantized_sdpa B=1 Hq=32 Hkv=8 Lq=1 Lk=65536 Dk=128 Dv=128 dtype=f16 mask=none window=0 lpad=0 "
          "rpad=0 sinks=0 softcap=0 scale=0 kmode=affine kbits=8 kgroup=64 vmode=affine vbits=8 vgroup=64 seed=1")


def rep(name, seconds, bytes_per_iter=None, label="", index=0, unit="ms", suffix="/real_time"):
    """One repetition row as Google Benchmark writes it."""
    row = {"name": name + suffix, "run_name": name + suffix, "run_type": "iteration", "repetition_index": index,
           "real_time": seconds / bt.UNIT_SECONDS[unit], "cpu_time": 0.0, "time_unit": unit, "label": label}
    if bytes_per_iter is not None:
        row["bytes_per_iter"] = bytes_per_iter
    return row


def reps(name, times, **kw):
    return [rep(name, t, index=i, **kw) for i, t in enumerate(times)]


def write(rows, context=None):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"context": context or {"kvlab_baseline_mib": "256"}, "benchmarks": rows}, f)
    f.close()
    atexit.register(os.unlink, f.name)
    return f.name


BASELINES = (
    # 1e9 bytes in 25 ms: 40 GB/s read; 1e9 bytes (read + written) in 50 ms: 20 GB/s memcpy.
    reps("baseline_read/pool/256MiB threads=2", [0.025] * 3, bytes_per_iter=1e9)
    + reps("baseline_memcpy/pool/256MiB threads=2", [0.050] * 3, bytes_per_iter=1e9))


class Names(unittest.TestCase):
    def test_suffixes_are_stripped_but_not_the_backend_colon(self):
        self.assertEqual(bt.base_name("rope/simd:AVX3/B=1 T=8/min_time:0.050/repeats:1/real_time"),
                         "rope/simd:AVX3/B=1 T=8")
        self.assertEqual(bt.base_name("rope/reference/B=1/iterations:1/real_time"), "rope/reference/B=1")

    def test_label_parses_to_parameters(self):
        self.assertEqual(bt.parse_label("rope B=1 dims=64 seed=1"), {"op": "rope", "B": "1", "dims": "64", "seed": "1"})


class Table(unittest.TestCase):
    def run_table(self, rows):
        out = io.StringIO()
        bt.table(write(list(BASELINES) + rows), out)
        return out.getvalue()

    def test_ratios_speedup_and_targets(self):
        # rope: 1e9 bytes in 0.1 s = 10 GB/s = 25 % of read, 50 % of memcpy (target 60: MISS by 10);
        # the reference at 1.0 s is 10x slower. kv_scatter: 1e9 bytes in 0.05 s = 20 GB/s = 100 %
        # of memcpy: PASS.
        rows = (reps("rope/simd:AVX3/T=8", [0.1, 0.1, 0.1], bytes_per_iter=1e9, label="rope B=1 T=8")
                + reps("rope/reference/T=8", [1.0], bytes_per_iter=1e9, label="rope B=1 T=8")
                + reps("kv_scatter/simd:AVX3/S=4", [0.05] * 3, bytes_per_iter=1e9, label="kv_scatter S=4"))
        text = self.run_table(rows)
        rope = next(l for l in text.splitlines() if l.startswith("rope") and "simd:AVX3" in l)
        self.assertIn("10.00", rope)
        self.assertIn("25.0", rope)
        self.assertIn("50.0", rope)
        self.assertIn("10.0x", rope)
        self.assertIn("MISS >= 60% memcpy", rope)
        self.assertIn("rope T=8 [simd:AVX3]: 50.0% of memcpy (target 60%): MISS by 10.0 points", text)
        self.assertIn("kv_scatter S=4 [simd:AVX3]: 100.0% of memcpy (target 60%): PASS", text)
        ref = next(l for l in text.splitlines() if l.startswith("rope") and "reference" in l)
        self.assertNotIn("PASS", ref)
        self.assertNotIn("MISS", ref)

    def test_aggregate_rows_do_not_replace_the_repetitions(self):
        # Google Benchmark appends mean/median/stddev/cv rows whose bytes_per_iter is the
        # aggregate of the counter (stddev: 0). GB/s must stay 1e9 B / 0.1 s = 10 GB/s.
        rows = reps("rope/simd:AVX3/T=8", [0.1] * 3, bytes_per_iter=1e9, label="rope B=1 T=8")
        for agg, value, t in (("mean", 1e9, 0.1), ("median", 1e9, 0.1), ("stddev", 0.0, 0.0), ("cv", 0.0, 0.0)):
            row = rep("rope/simd:AVX3/T=8", t, bytes_per_iter=value)
            row.update({"run_type": "aggregate", "aggregate_name": agg, "name": row["name"] + "_" + agg})
            rows.append(row)
        text = self.run_table(rows)
        rope = next(l for l in text.splitlines() if l.startswith("rope"))
        self.assertIn("10.00", rope)
        _, parsed = bt.load(write(rows))
        self.assertEqual(len(parsed["rope/simd:AVX3/T=8"].times), 3)

    def test_only_aggregates_still_give_gbps_and_noise(self):
        rows = []
        for agg, value, t in (("median", 1e9, 0.1), ("stddev", 0.0, 0.002)):
            row = rep("rope/simd:AVX3/T=8", t, bytes_per_iter=value)
            row.update({"run_type": "aggregate", "aggregate_name": agg})
            rows.append(row)
        r = bt.load(write(rows))[1]["rope/simd:AVX3/T=8"]
        self.assertAlmostEqual(r.gbps(), 10.0)
        self.assertAlmostEqual(r.noise(), 0.002)

    def test_decode_attention_target_needs_the_exact_shape(self):
        # 1.8e9 bytes in 0.1 s = 18 GB/s = 45 % of 40 GB/s read: exactly the 8-bit target.
        rows = reps("quantized_sdpa/simd:AVX3/Lk=65536 kbits=8 vbits=8", [0.1] * 3, bytes_per_iter=1.8e9,
                    label=QSDPA8)
        rows += reps("quantized_sdpa/simd:AVX3/Lk=32768 kbits=8 vbits=8", [0.1] * 3, bytes_per_iter=1.8e9,
                     label=QSDPA8.replace("Lk=65536", "Lk=32768"))
        text = self.run_table(rows)
        self.assertIn("45.0% of read (target 45%): PASS", text)
        short = next(l for l in text.splitlines() if "Lk=32768" in l and l.startswith("quantized_sdpa"))
        self.assertNotIn("PASS", short)

    def test_errors_are_listed_as_not_timed(self):
        rows = [{"name": "sdpa/simd:AVX3/x/real_time", "run_name": "sdpa/simd:AVX3/x/real_time",
                 "run_type": "iteration", "error_occurred": True, "time_unit": "us", "real_time": 0,
                 "error_message": "skipped: unsupported: sdpa"}]
        self.assertIn("1x skipped: unsupported: sdpa", self.run_table(rows))


class Compare(unittest.TestCase):
    def flagged(self, old_times, new_times, **kw):
        old = bt.load(write(reps("k/simd:AVX3/s", old_times)))[1]
        new = bt.load(write(reps("k/simd:AVX3/s", new_times)))[1]
        return bt.compare_rows(old, new, **kw)

    def test_a_change_far_beyond_the_noise_is_flagged(self):
        # medians 1.00 -> 1.20 (+20 %); MAD 0.01 -> noise 0.0148; 3 x noise = 0.044 < 0.2.
        flagged, quiet, _ = self.flagged([0.99, 1.00, 1.01, 1.00, 1.02], [1.19, 1.20, 1.21, 1.20, 1.18])
        self.assertEqual(len(flagged), 1)
        self.assertAlmostEqual(flagged[0][3], 20.0, places=6)
        self.assertEqual(quiet, 0)

    def test_a_change_within_three_noise_widths_is_not(self):
        # medians 1.00 -> 1.10 (+10 %) but the old run's MAD is 0.05 (noise 0.074): 0.1 < 0.22.
        flagged, quiet, _ = self.flagged([0.90, 0.95, 1.00, 1.05, 1.10], [1.09, 1.10, 1.11, 1.10, 1.10])
        self.assertEqual(flagged, [])
        self.assertEqual(quiet, 1)

    def test_a_tiny_change_with_no_noise_is_below_the_minimum_percent(self):
        # zero MAD on both sides, +1 %: beyond 3 x 0 but under MIN_PCT = 3.
        flagged, quiet, _ = self.flagged([1.0] * 5, [1.01] * 5)
        self.assertEqual(flagged, [])
        self.assertEqual(quiet, 1)
        # the same change with --min-pct 0.5 is flagged
        self.assertEqual(len(self.flagged([1.0] * 5, [1.01] * 5, min_pct=0.5)[0]), 1)

    def test_rows_without_repetitions_are_not_compared(self):
        flagged, quiet, not_compared = self.flagged([1.0], [2.0])
        self.assertEqual((flagged, quiet, not_compared), ([], 0, ["k/simd:AVX3/s"]))

    def test_fail_on_slowdown_exit_status(self):
        old = write(reps("k/simd:AVX3/s", [1.0] * 5))
        new = write(reps("k/simd:AVX3/s", [2.0] * 5))
        self.assertEqual(bt.compare(old, new, 3, 3, False, True, io.StringIO()), 1)
        self.assertEqual(bt.compare(new, old, 3, 3, False, True, io.StringIO()), 0)  # a speed-up
        self.assertEqual(bt.compare(new, old, 3, 3, True, False, io.StringIO()), 1)


if __name__ == "__main__":
    unittest.main()
