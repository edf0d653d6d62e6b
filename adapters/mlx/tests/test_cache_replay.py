"""The cache replay's script parser and observables, on scripts whose results follow from
the cache semantics alone (offsets and lengths counted by hand)."""

import importlib.util
import unittest

import mlx.core as mx

from kvlab_mlx import cache_replay
from kvlab_mlx.ops import EngineRaised, Unsupported
from kvlab_mlx.problem import Problem


def replay(line):
    p = Problem(line)
    s = cache_replay.Setup(p)
    script = cache_replay.parse_script(p.word("script"))
    tokens = sum(n * (rows or 1) for verb, n, rows, _ in script if verb in ("p", "d", "u", "r", "x"))
    rows = lambda h: s.batch * h * tokens
    mx.random.seed(1)
    inputs = {"q": mx.random.normal((rows(s.hq) * 2, s.dim)), "k": mx.random.normal((rows(s.hkv), s.dim)),
              "v": mx.random.normal((rows(s.hkv), s.dim))}
    return cache_replay.replay(p, inputs)


class ParseScript(unittest.TestCase):
    def test_commands(self):
        self.assertEqual(cache_replay.parse_script("p37.d2.s.t3.a.d"),
                         [("p", 37, 0, None), ("d", 2, 0, None), ("s", 0, 0, None), ("t", 3, 0, None),
                          ("a", 0, 0, None), ("d", 1, 0, None)])
        self.assertEqual(cache_replay.parse_script("k3_1_0.x2p6"), [("k", 0, 0, [3, 1, 0]), ("x", 6, 2, None)])
        self.assertEqual(cache_replay.parse_script("p4.q"), [("p", 4, 0, None), ("q", 0, 0, None)])

    def test_prefix_verbs_carry_their_ids(self):
        self.assertEqual(cache_replay.parse_script("w1_2.i.g1_7"),
                         [("w", 0, 0, [1, 2]), ("i", 0, 0, None), ("g", 0, 0, [1, 7])])

    def test_bad_word(self):
        with self.assertRaisesRegex(ValueError, "'q3' is not a command"):
            cache_replay.parse_script("p3.q3")

    def test_commands_not_replayed_say_why(self):
        for script, why in (("p8.m4", "quantization policy"), ("p6.e", "snapshot")):
            with self.assertRaisesRegex(Unsupported, why):
                cache_replay.parse_script(script)

    def test_prefix_scripts_need_an_engine_with_a_store(self):
        with self.assertRaisesRegex(Unsupported, "mlx-lm has no prefix store"):
            replay("cache kind=kv rope=0 script=w1_2.i.g1")


class Observables(unittest.TestCase):
    def test_kv_offsets_and_lengths(self):
        r = replay("cache kind=kv D=64 script=p3.d2.t1.d")
        self.assertEqual(r["offsets"].tolist(), [3, 4, 5, 4, 5])
        self.assertEqual(r["kv_length"].tolist(), [3, 4, 5, 4, 5])
        self.assertEqual(r["keys"].shape, (1 * 2 * 5, 64))  # B·Hkv·tokens rows
        self.assertEqual(r["attn"].shape, (1 * 4 * (3 + 3), 64))

    def test_rotating_ring_holds_max_tokens(self):
        r = replay("cache kind=rotating max=4 rope=0 D=32 script=p3.d5")
        self.assertEqual(r["offsets"].tolist(), [3, 4, 5, 6, 7, 8])
        self.assertEqual(r["kv_length"].tolist(), [3, 4, 4, 4, 4, 4])
        self.assertEqual(r["values"].shape, (2 * 4, 32))

    def test_to_quantized_midway(self):
        # p3 stores 3 tokens, q turns the KVCache into a QuantizedKVCache (same offset), d
        # adds one: the content is packed, (B·Hkv·4) rows of D·bits/32 words.
        r = replay("cache kind=kv rope=0 D=64 bits=4 group=32 script=p3.q.d")
        self.assertEqual(r["offsets"].tolist(), [3, 3, 4])
        self.assertEqual(r["kv_length"].tolist(), [3, 3, 4])
        self.assertEqual(r["keys.wq"].shape, (1 * 2 * 4, 64 * 4 // 32))
        self.assertEqual(r["values.scales"].shape, (8, 2))

    def test_unsupported_kinds_say_why(self):
        with self.assertRaisesRegex(Unsupported, "kind=turboquant"):
            replay("cache kind=turboquant rope=0 script=p3")
        with self.assertRaisesRegex(Unsupported, "affine only"):
            replay("cache kind=quantized rope=0 qmode=mxfp4 script=p3")


class Engines(unittest.TestCase):
    """The replay drives another engine's cache classes when chosen by name."""

    def tearDown(self):
        cache_replay.use_engine("mlx-lm")

    def test_mlx_vlm_counts_like_the_scripts_semantics(self):
        cache_replay.use_engine("mlx-vlm")
        self.assertEqual(cache_replay.engine().cache.__name__, "mlx_vlm.models.cache")
        r = replay("cache kind=kv D=64 script=p3.d2.t1.d")
        self.assertEqual(r["offsets"].tolist(), [3, 4, 5, 4, 5])
        r = replay("cache kind=rotating D=32 max=6 keep=2 script=p4.d5.s.d")  # s through state/meta_state
        self.assertEqual(r["offsets"].tolist(), [4, 5, 6, 7, 8, 9, 9, 10])

    def test_an_unknown_engine_is_named(self):
        with self.assertRaisesRegex(ValueError, "unknown cache engine 'vllm'"):
            cache_replay.use_engine("vllm")

    def test_mlx_vlm_batch_quantized_counts_rows_and_packed_widths(self):
        cache_replay.use_engine("mlx-vlm")
        # lpad=1 over 2 rows: left padding [0, 1], so offsets start at [0, -1].
        r = replay("cache kind=batch_quantized B=2 lpad=1 D=64 bits=4 group=32 rope=0 script=p3.d")
        self.assertEqual(r["offsets"].tolist(), [3, 2, 4, 3])
        self.assertEqual(r["kv_length"].tolist(), [3, 4])
        self.assertEqual(r["keys.wq"].shape, (2 * (4 + 3), 64 * 4 // 32))  # Hkv·tokens per row, extracted
        self.assertEqual(r["values.biases"].shape, (14, 2))


def prefix_replay(line):
    """A prefix script: k and v are the id table, (1 + the largest id)·Hkv rows; no q."""
    p = Problem(line)
    s = cache_replay.Setup(p)
    top = max(i for verb, _, _, ids in cache_replay.parse_script(p.word("script")) if ids for i in ids)
    mx.random.seed(2)
    table = lambda: mx.random.normal(((top + 1) * s.hkv, s.dim))
    k, v = table(), table()
    return cache_replay.replay(p, {"q": mx.zeros((0, s.dim)), "k": k, "v": v}), k


@unittest.skipUnless(importlib.util.find_spec("vllm_mlx"), "vllm-mlx is in build/venv-vllm-mlx only "
                     "(adapters/mlx/vllm_mlx_replay.sh runs these there)")
class PrefixVerbs(unittest.TestCase):
    """w, i and g through vllm-mlx's MemoryAwarePrefixCache, counted by hand."""

    def setUp(self):
        cache_replay.use_engine("vllm-mlx")

    def tearDown(self):
        cache_replay.use_engine("mlx-lm")

    def test_a_diverging_request_reuses_the_common_prefix(self):
        r, k = prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2_3.i.g1_2_9")
        self.assertEqual(r["offsets"].tolist(), [3, 3, 2])
        # the reused cache holds tokens 1 and 2: their rows of the table, head by head
        want = mx.stack([k[2 * i:2 * i + 2] for i in (1, 2)], axis=1).reshape(-1, 16)
        self.assertTrue(mx.array_equal(r["keys"], want).item())

    def test_a_miss_gives_an_empty_cache(self):
        r, _ = prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2.i.g5")
        self.assertEqual(r["offsets"].tolist(), [2, 2, 0])
        self.assertEqual(r["keys"].shape, (0, 16))

    def test_a_supersequence_hit_is_judged_and_stops_the_script(self):
        with self.assertRaisesRegex(EngineRaised, "g1_2: a supersequence hit .* equal a fresh"):
            prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2_3.i.g1_2.w4")


class KvlabPolicyRule(unittest.TestCase):
    """kvlab_mlx/prefix_stores.py's shadow of cache/prefix_cache.h's matching rule, on keys."""

    def policy(self, *entries):
        from kvlab_mlx.prefix_stores import KvlabPolicy

        pol = KvlabPolicy()
        for tokens, trimmable in entries:
            pol.insert(tokens, trimmable)
        return pol

    def test_each_kind(self):
        pol = self.policy(([1, 2, 3], True))
        self.assertEqual(pol.fetch([1, 2, 3]), (3, "exact"))
        self.assertEqual(pol.fetch([1, 2, 3, 4]), (3, "prefix"))
        self.assertEqual(pol.fetch([1, 2]), (1, "supersequence"))  # one token left to process
        self.assertEqual(pol.fetch([1, 2, 9]), (2, "lcp"))
        self.assertEqual(pol.fetch([1]), (0, "miss"))  # a supersequence reusing nothing is a miss
        self.assertEqual(pol.fetch([5]), (0, "miss"))

    def test_an_untrimmable_entry_serves_only_as_exact_or_prefix(self):
        pol = self.policy(([1, 2, 3], False))
        self.assertEqual(pol.fetch([1, 2, 3, 4]), (3, "prefix"))
        self.assertEqual(pol.fetch([1, 2, 9]), (0, "miss"))

    def test_a_trimmable_insert_drops_its_stored_prefixes(self):
        pol = self.policy(([1, 2], True), ([1, 2, 3], True))
        self.assertEqual(pol.fetch([1, 2]), (1, "supersequence"))
        pol = self.policy(([1, 2], True), ([1, 2, 3], False))  # an untrimmable one keeps them
        self.assertEqual(pol.fetch([1, 2]), (2, "exact"))

    def test_a_stored_prefix_beats_an_equally_long_trim(self):
        pol = self.policy(([1, 2, 7, 8], True), ([1, 2], True))  # stored after: not dropped
        self.assertEqual(pol.fetch([1, 2, 9]), (2, "prefix"))


@unittest.skipUnless(importlib.util.find_spec("vllm_mlx"), "vllm-mlx is in build/venv-vllm-mlx only "
                     "(adapters/mlx/vllm_mlx_replay.sh runs these there)")
class PrefixStores(unittest.TestCase):
    """vllm-mlx's other prefix stores through the same verbs: a reuse that differs from
    kvlab's rule, and a kv_quantize hit, are judged and stop the script."""

    def tearDown(self):
        cache_replay.use_engine("mlx-lm")

    def test_manager_agrees_on_a_stored_prefix(self):
        cache_replay.use_engine("vllm-mlx-manager")
        r, _ = prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2.i.g1_2_9")
        self.assertEqual(r["offsets"].tolist(), [2, 2, 2])

    def test_manager_without_lcp_reuse_is_a_finding(self):
        cache_replay.use_engine("vllm-mlx-manager")
        with self.assertRaisesRegex(EngineRaised, "g1_2_9: the store's miss answer reuses 0 tokens where kvlab's lcp "
                                                  "answer reuses 2; its K/V equal"):
            prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2_3.i.g1_2_9")

    def test_manager_missing_a_stored_prefix_names_it(self):
        cache_replay.use_engine("vllm-mlx-manager")
        with self.assertRaisesRegex(EngineRaised, "its own store holds a 2-token prefix"):
            prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2.i.w3_4.i.g1_2_3_9")

    def test_kv_quantize_hit_is_judged_exactly(self):
        cache_replay.use_engine("vllm-mlx-kvq")
        with self.assertRaisesRegex(EngineRaised, "g1_2_9: a kv_quantize lcp hit of 2 tokens .1 left to process. "
                                                  "returns K/V equal to dequantize.quantize.fresh.. at 8 bits, "
                                                  "group 64; .* .within it."):
            prefix_replay("cache kind=kv Hkv=2 D=64 dtype=f16 rope=0 script=w1_2_3.i.g1_2_9")

    def test_paged_block_served_under_another_prefix_is_a_finding(self):
        cache_replay.use_engine("vllm-mlx-paged")
        with self.assertRaisesRegex(EngineRaised, "g1_2_5: the store's 1-block reconstruct_cache answer reuses 2 tokens that begin no "
                                                  "stored sequence .stored: 3_3_1_2.: K/V computed under another prefix"):
            prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w3_3_1_2.i.g1_2_5")

    def test_paged_shares_whole_blocks(self):
        cache_replay.use_engine("vllm-mlx-paged")
        r, _ = prefix_replay("cache kind=kv Hkv=2 D=16 rope=0 script=w1_2_3_4.i.g1_2_3_4_9")
        self.assertEqual(r["offsets"].tolist(), [4, 4, 4])

    def test_kv_quantize_leaves_a_ring_as_it_is(self):
        cache_replay.use_engine("vllm-mlx-kvq")
        r, _ = prefix_replay("cache kind=rotating max=8 Hkv=2 D=16 rope=0 script=w1_2_3.i.g1_2_9")
        self.assertEqual(r["offsets"].tolist(), [3, 3, 2])


if __name__ == "__main__":
    unittest.main()
