"""The vllm-mlx golden replay's own logic (kvlab_mlx/golden_replay_vllm.py) without vllm-mlx:
which scenarios it does not drive, the reused-prefix check against kvlab's goldens, and how
a scheduler step's outputs become drive_batch's responses. The replay itself runs in
vllm-mlx's venv (CTest golden.replay_vllm_mlx)."""

import types
import unittest

from kvlab_mlx import golden_replay_vllm as gv
from kvlab_mlx.golden_scenario import parse_line


def _scenario(line):
    return parse_line(line)


class NotReplayed(unittest.TestCase):
    def test_kv_bits_and_save_at_are_not_driven(self):
        for line in ("kv8 prompts=13 steps=24 kv_bits=8 kv_group_size=32 quantized_kv_start=16",
                     "kv4 prompts=13 steps=24 kv_bits=4 kv_group_size=32 quantized_kv_start=16"):
            self.assertEqual(gv.not_replayed(_scenario(line)), gv.KV_BITS_REASON)
        self.assertEqual(gv.not_replayed(_scenario("save_load prompts=13 steps=24 save_at=9")), gv.SAVE_LOAD_REASON)

    def test_the_scheduler_drives_the_rest(self):
        for line in ("plain prompts=13 steps=24", "window prompts=13 steps=24 max_kv_size=20",
                     "batch prompts=13,6,9 steps=16 finish=1@6 join=7@8",
                     "prefix prompts=14 steps=12 prefix=10 second=5",
                     "device_batch prompts=13,6,9 steps=16 batch_cache=device"):
            self.assertIsNone(gv.not_replayed(_scenario(line)), line)

    def test_reasons_fit_a_table_cell(self):
        # the reasons are printed as table cells: one line each, no '|' (a markdown column)
        for reason in (gv.KV_BITS_REASON, gv.SAVE_LOAD_REASON):
            self.assertNotIn("|", reason)
            self.assertNotIn("\n", reason)


def _seq(reused):
    return types.SimpleNamespace(reused=reused)


class Reused(unittest.TestCase):
    def test_equal_counts_pass(self):
        self.assertEqual(gv.reused_mismatches([_seq(None), _seq(10)], {"seq.1.reused": "10"}), [])
        self.assertEqual(gv.reused_mismatches([_seq(None)], {}), [])

    def test_a_store_that_recomputes_is_caught(self):
        self.assertEqual(gv.reused_mismatches([_seq(None), _seq(0)], {"seq.1.reused": "10"}),
                         ["seq 1 reused 0, kvlab's golden 10"])

    def test_a_count_on_one_side_only_is_caught(self):
        self.assertEqual(len(gv.reused_mismatches([_seq(None), _seq(3)], {})), 1)
        self.assertEqual(len(gv.reused_mismatches([_seq(None), _seq(None)], {"seq.1.reused": "0"})), 1)


class _Output:
    def __init__(self, rid, tokens, finish_reason=None):
        self.request_id, self.new_token_ids, self.finish_reason = rid, tokens, finish_reason


def _driver(outputs_per_step, logged=()):
    d = object.__new__(gv.SchedulerDriver)
    steps = iter(outputs_per_step)
    d.scheduler = types.SimpleNamespace(step=lambda: types.SimpleNamespace(outputs=next(steps)))
    d.errors = gv._Errors()
    d.errors.messages.extend(logged)
    return d


class Step(unittest.TestCase):
    def test_one_response_per_token_the_finish_on_the_last(self):
        d = _driver([[_Output("r0", [5]), _Output("r1", [7, 8], "length")], []])
        _, rs = d.step()
        self.assertEqual([(r.uid, r.token, r.finish_reason) for r in rs],
                         [("r0", 5, None), ("r1", 7, None), ("r1", 8, "length")])
        self.assertEqual(d.step(), (None, []))  # a prefill step delivers nothing

    def test_the_schedulers_caught_error_is_raised_with_its_message(self):
        d = _driver([[_Output("r0", [], "error")]], logged=["Error in batch generation step: boom"])
        with self.assertRaisesRegex(RuntimeError, "vllm-mlx scheduler: Error in batch generation step: boom"):
            d.step()

    def test_logged_errors_keep_the_first_line(self):
        import logging

        h = gv._Errors()
        h.emit(logging.LogRecord("vllm_mlx.scheduler", logging.ERROR, "f", 1, "bad: x\nTraceback ...", None, None))
        self.assertEqual(h.messages, ["bad: x"])


class Stubs(unittest.TestCase):
    def test_a_stub_never_replaces_an_installed_module(self):
        import sys

        self.assertIs(sys.modules.get("unittest"), unittest)
        gv._stub("unittest", AutoTokenizer=None)
        self.assertIs(sys.modules["unittest"], unittest)


if __name__ == "__main__":
    unittest.main()
