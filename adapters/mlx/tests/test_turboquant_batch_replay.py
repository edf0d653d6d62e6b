"""kvlab_mlx.turboquant_batch_replay's own logic: the seeded plans, the checks, the
register matching; and that the checks fail on a batch cache broken on purpose (a filter
that keeps the wrong rows or forgets the padding it trims, an extend that misaligns)."""

import importlib.util
import os
import tempfile
import unittest

from kvlab_mlx import known
from kvlab_mlx import turboquant_batch_replay as tbr


class Plans(unittest.TestCase):
    def test_a_seed_is_its_plan(self):
        self.assertEqual(tbr.plan(7), tbr.plan(7))
        self.assertNotEqual(tbr.plan(7), tbr.plan(8))

    def test_plans_are_well_formed(self):
        for s in range(200):
            p = tbr.plan(s)
            c = p["config"]
            self.assertIn(c["dim"], tbr.DIMS)
            self.assertIn(c["bits"], tbr.BITS)
            self.assertEqual(p["ops"][0]["op"], "prefill")
            rows = 0
            for o in p["ops"]:
                if o["op"] in ("prefill", "extend"):
                    self.assertEqual(sum(o["chunks"]), max(o["lens"]))
                    self.assertTrue(all(n >= 1 for n in o["chunks"] + o["lens"]))
                    rows = len(o["lens"]) if o["op"] == "prefill" else rows + len(o["lens"])
                elif o["op"] == "extend_empty":
                    self.assertIn(o["side"], ("self", "other"))
                    rows += o["rows"]
                elif o["op"] == "filter":
                    self.assertTrue(0 < len(o["keep"]) < rows)
                    self.assertEqual(len(set(o["keep"])), len(o["keep"]))
                    self.assertTrue(all(0 <= i < rows for i in o["keep"]))
                    rows = len(o["keep"])

    def test_every_operation_is_drawn(self):
        ops = {o["op"] for s in range(100) for o in tbr.plan(s)["ops"]}
        self.assertEqual(ops, {"prefill", "decode", "filter", "extend", "extend_empty", "trim", "roundtrip",
                               "snapshot"})


class Register(unittest.TestCase):
    def test_findings_match_entries_by_op_and_what(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "reg")
            with open(path, "w") as f:
                f.write("mlx-vlm | decode what=snapshot | upstream-bug | moved (T1)\n")
            (e,) = known.read(path)
        p = {"seed": 3, "config": {"dim": 64, "heads": 1, "bits": 3.5, "codec_seed": 0}}
        line = tbr._finding_line(p, "decode", "snapshot")
        self.assertEqual(line.line, "decode what=snapshot dim=64 bits=3.5 seed=3")
        self.assertTrue(e.matches(line))
        self.assertFalse(e.matches(tbr._finding_line(p, "trim", "snapshot")))
        self.assertFalse(e.matches(tbr._finding_line(p, "decode", "codes")))


def _plan(ops, bits=4.0, dim=64, seed=5):
    return {"seed": seed, "config": {"dim": dim, "heads": 2, "bits": bits, "codec_seed": 11}, "ops": ops}


PREFILL = {"op": "prefill", "lens": [3, 7, 5], "chunks": [4, 3], "decode": 1}


@unittest.skipUnless(importlib.util.find_spec("mlx_vlm"), "mlx-vlm is in build/venv")
class AgainstTheEngine(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mx, cls.tq = tbr._load()

    def run_with(self, ops, batch_class=None, **kw):
        tq = self.tq

        class R(tbr.Run):
            def new_batch(self, left_padding):
                cls = batch_class or tq.BatchTurboQuantKVCache
                return cls(left_padding, self.cfg["bits"], seed=self.cfg["codec_seed"])

        return tbr.run_plan(_plan(ops, **kw), self.mx, self.tq, R)

    def test_rows_equal_the_rows_alone_through_every_operation(self):
        ops = [PREFILL, {"op": "decode", "n": 2}, {"op": "filter", "keep": [2, 0]},
               {"op": "extend", "lens": [2, 9], "chunks": [9], "decode": 2}, {"op": "trim", "n": 2},
               {"op": "roundtrip"}, {"op": "decode", "n": 1}]
        for bits, dim in ((3.0, 64), (4.0, 96), (3.5, 64)):
            self.assertEqual(self.run_with(ops, bits=bits, dim=dim), [], (bits, dim))

    def test_the_in_place_offset_is_seen_through_a_held_state(self):
        found = self.run_with([PREFILL, {"op": "snapshot"}, {"op": "decode", "n": 1}])
        self.assertEqual([(op, what) for op, what, _ in found], [("decode", "snapshot")])

    def test_an_extend_with_an_empty_side_loses_its_storage(self):
        # T2 on the engine; an extend that gives the empty side its padding passes
        for side in ("other", "self"):
            ops = [PREFILL, {"op": "extend_empty", "rows": 2, "side": side}, {"op": "decode", "n": 1}]
            self.assertEqual([(op, what) for op, what, _ in self.run_with(ops)], [("extend_empty", "rows")])
        tq, mx = self.tq, self.mx

        class PadsTheEmptySide(tq.BatchTurboQuantKVCache):
            def extend(self, other):
                if (self.keys is None) != (other.keys is None):
                    empty, full = (self, other) if self.keys is None else (other, self)
                    rows = empty.batch_size

                    def zeros(state):
                        state = tq._slice_state(state, full._idx)
                        return tq._map_state(state, lambda a, nd: mx.zeros((rows,) + a.shape[1:], a.dtype))

                    empty.keys, empty.values = zeros(full.keys), zeros(full.values)
                    empty.left_padding = empty.left_padding + full._idx
                    empty._idx = full._idx
                    empty.key_codec, empty.value_codec = full.key_codec, full.value_codec
                super().extend(other)

        for side in ("other", "self"):
            ops = [PREFILL, {"op": "extend_empty", "rows": 2, "side": side}, {"op": "decode", "n": 2},
                   {"op": "filter", "keep": [4, 1]}, {"op": "decode", "n": 1}]
            self.assertEqual(self.run_with(ops, batch_class=PadsTheEmptySide), [], side)

    def test_a_filter_keeping_the_wrong_rows_is_caught(self):
        base = self.tq.BatchTurboQuantKVCache

        class WrongRows(base):
            def filter(self, batch_indices):
                # the codes of the kept rows in reverse order, the bookkeeping of the right ones
                # (the padding trim takes the minimum, the same in either order)
                super().filter(batch_indices[::-1])
                self.offset = self.offset[::-1]
                self.left_padding = self.left_padding[::-1]

        found = self.run_with([PREFILL, {"op": "filter", "keep": [0, 2]}], batch_class=WrongRows)
        self.assertIn(("filter", "codes"), [(op, what) for op, what, _ in found])

    def test_a_filter_forgetting_its_padding_trim_is_caught(self):
        class KeepsPadding(self.tq.BatchTurboQuantKVCache):
            def filter(self, batch_indices):
                lp = self.left_padding[batch_indices]
                super().filter(batch_indices)
                self.left_padding = lp  # the trimmed columns still counted as padding

        # rows 0 and 2 (lengths 3, 5) both padded: filter trims 2 columns
        found = self.run_with([PREFILL, {"op": "filter", "keep": [0, 2]}, {"op": "decode", "n": 1}],
                              batch_class=KeepsPadding)
        whats = {(op, what) for op, what, _ in found}
        self.assertIn(("filter", "position"), whats)
        self.assertIn(("decode", "mask"), whats)

    def test_an_extend_that_does_not_realign_is_caught(self):
        class NoRealign(self.tq.BatchTurboQuantKVCache):
            def extend(self, other):
                lp = self.left_padding
                super().extend(other)
                n = lp.shape[0]
                # the first batch's padding as it was, though its rows were shifted right
                self.left_padding = self.mx.concatenate([lp, self.left_padding[n:]])

        NoRealign.mx = self.mx
        found = self.run_with([PREFILL, {"op": "extend", "lens": [12], "chunks": [12], "decode": 0}],
                              batch_class=NoRealign)
        self.assertIn(("extend", "position"), [(op, what) for op, what, _ in found])

    def test_main_fails_on_an_unlisted_finding_and_on_a_stale_entry(self):
        seed = 31  # its plan decodes, takes a state, decodes: one finding, decode what=snapshot
        self.assertEqual([(op, what) for op, what, _ in tbr.run_plan(tbr.plan(seed), self.mx, self.tq)],
                         [("decode", "snapshot")])
        with tempfile.TemporaryDirectory() as tmp:
            def register(text):
                path = os.path.join(tmp, str(len(text)))
                with open(path, "w") as f:
                    f.write(text)
                return path

            listed = "mlx-vlm | decode what=snapshot | upstream-bug | moved (T1)\n"
            stale = "mlx-vlm | filter what=codes | upstream-bug | never seen (T9)\n"
            only = ["--seed", "0", "--only", str(seed), "--known"]
            self.assertEqual(tbr.main(only + [register("")]), 1)
            self.assertEqual(tbr.main(only + [register(listed)]), 0)
            self.assertEqual(tbr.main(only + [register(listed + stale)]), 1)


if __name__ == "__main__":
    unittest.main()
