"""mlx-vlm's APC as a prefix store (kvlab_mlx/prefix_store_apc.py): its own reuse rule
(pure) and the replay's judgement of its hits (with mlx-vlm, in build/venv)."""

import importlib.util
import unittest

from kvlab_mlx import cache_replay
from kvlab_mlx.ops import EngineRaised
from kvlab_mlx.prefix_store_apc import apc_rule

try:  # unittest discover -s tests (conformance.adapter_mlx_unittest), or -m unittest tests.X
    from test_cache_replay import prefix_replay
except ImportError:
    from tests.test_cache_replay import prefix_replay


class ApcRule(unittest.TestCase):
    def test_block_mode_leaves_the_last_token(self):
        self.assertEqual(apc_rule("block", [[1, 2, 3]], [1, 2, 3]), 2)
        self.assertEqual(apc_rule("block", [[1, 2, 3]], [1, 2, 3, 4]), 3)
        self.assertEqual(apc_rule("block", [[1, 2, 3]], [1]), 0)  # one token: nothing to reuse

    def test_block_mode_shares_any_stored_prefix(self):
        self.assertEqual(apc_rule("block", [[1, 2, 3, 4]], [1, 2, 9]), 2)  # lcp
        self.assertEqual(apc_rule("block", [[1, 2, 3, 4]], [1, 2]), 1)  # supersequence: n - 1
        self.assertEqual(apc_rule("block", [[5, 1, 2]], [1, 2, 3]), 0)  # chained: not after another prefix

    def test_block_mode_counts_whole_blocks(self):
        self.assertEqual(apc_rule("block", [[1, 2, 3]], [1, 2, 3, 4], block_size=2), 2)  # the partial block
        self.assertEqual(apc_rule("block", [[1, 2, 3, 4]], [1, 2, 3, 9], block_size=2), 2)
        self.assertEqual(apc_rule("block", [[1, 2, 3, 4]], [1, 2, 3, 4, 5], block_size=2), 4)

    def test_checkpoint_mode_reuses_a_stored_prefix_only(self):
        stored = [[1, 2], [1, 2, 3, 4]]
        self.assertEqual(apc_rule("checkpoint", stored, [1, 2, 3, 4, 5]), 4)
        self.assertEqual(apc_rule("checkpoint", stored, [1, 2, 3, 4]), 2)  # equal: at most n - 1
        self.assertEqual(apc_rule("checkpoint", stored, [1, 2, 3, 9]), 2)  # never trimmed
        self.assertEqual(apc_rule("checkpoint", [[1, 2, 3]], [1, 2]), 0)


@unittest.skipUnless(importlib.util.find_spec("mlx_vlm"), "mlx-vlm is in build/venv")
class ApcStore(unittest.TestCase):
    def tearDown(self):
        cache_replay.use_engine("mlx-lm")

    def test_a_prefix_hit_agrees(self):
        cache_replay.use_engine("mlx-vlm-apc")
        r, _ = prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2.i.g1_2_9")
        self.assertEqual(r["offsets"].tolist(), [2, 2, 2])

    def test_an_exact_request_leaves_one_token(self):
        cache_replay.use_engine("mlx-vlm-apc")
        with self.assertRaisesRegex(EngineRaised, "g1_2_3: the store's block answer reuses 2 tokens where kvlab's "
                                                  "exact answer reuses 3; as its block rule gives; its K/V equal"):
            prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2_3.i.g1_2_3")

    def test_a_ring_checkpoint_is_not_trimmed(self):
        cache_replay.use_engine("mlx-vlm-apc")
        with self.assertRaisesRegex(EngineRaised, "g1_2_9: the store's miss answer reuses 0 tokens where kvlab's lcp"):
            prefix_replay("cache kind=rotating max=8 Hkv=2 D=16 rope=0 script=w1_2_3.i.g1_2_9")

    def test_a_quantized_hit_is_judged_against_the_stored_codes(self):
        cache_replay.use_engine("mlx-vlm-apc")
        with self.assertRaisesRegex(EngineRaised, "returns a float KVCache equal to dequantize.stored codes."):
            prefix_replay("cache kind=quantized Hkv=2 D=64 bits=4 group=32 rope=0 script=w1_2_3.i.g1_2_9")
        cache_replay.use_engine("mlx-vlm-apc-kvq")
        with self.assertRaisesRegex(EngineRaised, "returns codes that DIFFER from the stored .fresh. ones"):
            prefix_replay("cache kind=quantized Hkv=2 D=64 bits=4 group=32 rope=0 script=w1_2_3.i.g1_2_9")


if __name__ == "__main__":
    unittest.main()
