"""The golden replay: the scenario parser, the prompt-token rule, and end-to-end replays
of golden/scenarios lines on stand-in model directories (tests/golden_synth.py)."""

import contextlib
import hashlib
import io
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from safetensors import safe_open

from kvlab_mlx import __main__ as cli
from kvlab_mlx import golden_replay as gr

from golden_synth import make_model_dir

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "golden"


class ParseLine(unittest.TestCase):
    def test_defaults(self):
        s = gr.parse_line("plain      prompts=13 steps=24")
        self.assertEqual((s.name, s.prompts, s.steps, s.seed), ("plain", [13], 24, 1))
        self.assertEqual((s.kv_bits, s.kv_group_size, s.quantized_kv_start, s.max_kv_size), (None, 64, 5000, None))
        self.assertEqual(s.kind, "single")
        self.assertEqual(s.line, "plain      prompts=13 steps=24")

    def test_every_key(self):
        s = gr.parse_line("q prompts=13 steps=24 seed=7 kv_bits=4 kv_group_size=32 quantized_kv_start=16 "
                          "max_kv_size=20 max_dlogit=1e-2 max_mean_kld=0.5 min_top1=0.9 attn_rel=.001  # note")
        self.assertEqual((s.seed, s.kv_bits, s.kv_group_size, s.quantized_kv_start, s.max_kv_size), (7, 4, 32, 16, 20))
        self.assertEqual(s.tolerance, {"max_dlogit": 1e-2, "max_mean_kld": 0.5, "min_top1": 0.9, "attn_rel": 1e-3})
        b = gr.parse_line("batch prompts=13,6,9 steps=16 finish=1@6 join=7@8")
        self.assertEqual((b.prompts, b.finish, b.join, b.kind), ([13, 6, 9], (1, 6), (7, 8), "batch"))
        p = gr.parse_line("prefix prompts=14 steps=12 prefix=10 second=5")
        self.assertEqual((p.prefix, p.second, p.kind), (10, 5, "prefix"))
        self.assertEqual(gr.parse_line("sl prompts=13 steps=24 save_at=9").kind, "save_load")
        d = gr.parse_line("device_batch prompts=13,6,9 steps=16 batch_cache=device")
        self.assertEqual((d.batch_cache, d.kind, b.batch_cache), ("device", "batch", "host"))

    def test_comments_and_blank(self):
        self.assertIsNone(gr.parse_line("   # only a comment"))
        self.assertIsNone(gr.parse_line(""))

    def test_bad_lines_name_key_and_line(self):
        bad = {
            "a prompts=13 steps=24 colour=red": "unknown key 'colour'",
            "a prompts=13 steps=24 steps=3": "key 'steps' repeated",
            "a steps=24": "required key 'prompts' missing",
            "a prompts=13": "required key 'steps' missing",
            "a prompts=13,x steps=2": "prompts=13,x: 'x'",
            "a prompts=0 steps=2": "prompts=0: '0'",
            "a prompts=3 steps=0": "steps=0",
            "a prompts=3 steps=-1": "steps=-1",
            "a prompts=3 steps=2 kv_bits=7": "kv_bits=7",
            "a prompts=3 steps=2 kv_group_size=32": "key 'kv_group_size' without kv_bits",
            "a prompts=3 steps=2 kv_bits=4 kv_group_size=48": "kv_group_size=48",
            "a prompts=3 steps=2 max_kv_size=0": "max_kv_size=0",
            "a prompts=3,4 steps=8 finish=2@3": "finish=2@3: request 2",
            "a prompts=3,4 steps=8 finish=1@8": "finish=1@8: K",
            "a prompts=3,4 steps=8 finish=1": "finish=1: not A@B",
            "a prompts=3 steps=8 join=4@8": "join=4@8",
            "a prompts=14 steps=8 prefix=10": "'prefix' and 'second' go together",
            "a prompts=14 steps=8 prefix=15 second=2": "prefix=15",
            "a prompts=14,3 steps=8 prefix=10 second=2": "key 'prefix' goes with one prompt",
            "a prompts=14 steps=8 save_at=8": "save_at=8",
            "a prompts=14 steps=8 save_at=2 join=3@1": "key 'save_at' goes with one prompt",
            "a prompts=14 steps=8 min_top1=2": "min_top1=2",
            "a prompts=14 steps=8 max_dlogit=-1": "max_dlogit=-1",
            "a prompts=14 steps=8 seed": "'seed' is not key=value",
            "x=1 prompts=14 steps=8": "'x=1' is not a scenario name",
            "a prompts=14 steps=4097": "steps=4097: above the cap of 4096",
            "a prompts=14 steps=100000000": "steps=100000000: above the cap",
            "a prompts=4097 steps=2": "4097 is above the cap of 4096 tokens",
            "a prompts=" + ",".join(["1"] * 17) + " steps=2": "more than 16 requests",
            "a prompts=3,4 steps=8 batch_cache=gpu": "batch_cache=gpu: not host or device",
            "a prompts=3 steps=8 batch_cache=device": "key 'batch_cache' applies to a batch",
            "a prompts=3,4 steps=8 batch_cache=device finish=1@2": "batch_cache=device cannot run finish=/join=",
            "a prompts=3,4 steps=8 batch_cache=device join=2@1": "batch_cache=device cannot run finish=/join=",
        }
        for line, what in bad.items():
            with self.subTest(line=line):
                with self.assertRaises(gr.ScenarioError) as cm:
                    gr.parse_line(line, "f:3")
                msg = str(cm.exception)
                self.assertIn(what, msg)
                self.assertIn(repr(line), msg)
                self.assertTrue(msg.startswith("f:3: "), msg)

    def test_file(self):
        with self.assertRaisesRegex(gr.ScenarioError, r"s:3: scenario 'a' repeated"):
            gr.parse_scenarios("a prompts=1 steps=1\n# c\na prompts=2 steps=1\n", "s")
        for path in sorted((GOLDEN / "scenarios").iterdir()):
            names = [s.name for s in gr.read_scenarios(path)]
            self.assertEqual(names, ["plain", "kv8", "kv4", "window", "batch", "prefix", "save_load",
                                     "device_batch"], path)


class PromptTokens(unittest.TestCase):
    # harness/rng.h's splitmix64 compiled with g++ (and the first outputs of Vigna's
    # SplitMix64 stream from state 0: E220A8397B1DCDAF, 6E789E6AA1B965F4).
    SPLITMIX = {0: 0xE220A8397B1DCDAF, 0x9E3779B97F4A7C15: 0x6E789E6AA1B965F4, 1: 0x910A2DEC89025CC1,
                1000003: 0x5A0052B913B21D24, 0xFFFFFFFFFFFFFFFF: 0xE4D971771B652C20}

    def test_splitmix64(self):
        for x, want in self.SPLITMIX.items():
            self.assertEqual(gr.splitmix64(x), want, hex(x))

    def test_transcribed_formula(self):
        def c_splitmix(x):  # the C++ lines, uint64 arithmetic by explicit masking
            m = 2**64
            x = (x + 0x9E3779B97F4A7C15) % m
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % m
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % m
            return x ^ (x >> 31)

        for x in (2, 12345, 2**63, 2**64 - 2, 0xDEADBEEFCAFEBABE):
            self.assertEqual(gr.splitmix64(x), c_splitmix(x))

    def test_prompt_rule(self):
        # splitmix64(seed*1000003 + p*10007 + j) mod vocab, from the C++ above.
        self.assertEqual(gr.prompt_tokens(1, 0, 13, 256), [36, 67, 13, 224, 5, 139, 254, 47, 161, 147, 245, 238, 28])
        self.assertEqual(gr.prompt_tokens(1, 1, 5, 256), [124, 154, 245, 41, 220])
        self.assertEqual(gr.prompt_tokens(2**64 - 1, 2, 4, 1000), [522, 729, 967, 512])  # seed*1000003 wraps

    def test_request_order(self):
        b = gr.parse_line("b prompts=3,2 steps=4 join=4@1 seed=5")
        self.assertEqual(b.request_prompts(256), [gr.prompt_tokens(5, 0, 3, 256), gr.prompt_tokens(5, 1, 2, 256),
                                                  gr.prompt_tokens(5, 2, 4, 256)])
        p = gr.parse_line("p prompts=6 steps=4 prefix=4 second=3")
        first, second = p.request_prompts(256)
        self.assertEqual(second, first[:4] + gr.prompt_tokens(1, 1, 3, 256))


def _read(path):
    with safe_open(str(path), "numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _single(model, prompt, steps):
    """generate_step alone: tokens and raw logits of `steps` steps."""
    rows = []

    def keep(tokens, logits):
        rows.append(logits[0])
        return logits

    tokens = [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=steps, logits_processors=[keep])]
    mx.eval(rows)
    return tokens, np.stack([np.array(r) for r in rows[:steps]])


class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.dense = make_model_dir(GOLDEN / "models/llama_dense/config.json", root / "models/llama_dense")
        cls.hybrid = make_model_dir(GOLDEN / "models/llama_hybrid/config.json", root / "models/llama_hybrid")
        cls.out = root / "out"
        out = io.StringIO()
        with mock.patch.dict(os.environ, {"KVLAB_COMMIT": "abc123"}), contextlib.redirect_stdout(out):
            rc = cli.main(["golden", "--model", cls.dense, "--scenarios", str(GOLDEN / "scenarios/llama_dense"),
                           "--scenario", "plain", "save_load", "batch", "prefix", "--out", str(cls.out)])
        cls.printed = out.getvalue()
        assert rc == 0, cls.printed
        cls.files = {n: _read(cls.out / f"llama_dense.{n}.mlx-lm.safetensors")
                     for n in ("plain", "save_load", "batch", "prefix")}
        cls.rp = gr.Replayer(cls.dense, "llama_dense")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_printed_and_written(self):
        lines = self.printed.splitlines()
        self.assertEqual([l.split(":")[0] for l in lines], ["plain", "batch", "prefix", "save_load"])
        self.assertIn("sequences=4 steps=16,6,16,16 status=ok; ok; ok; ok", lines[1])
        self.assertEqual(sorted(p.name for p in self.out.iterdir()),
                         sorted(f"llama_dense.{n}.mlx-lm.safetensors" for n in ("plain", "save_load", "batch", "prefix")))

    def test_metadata(self):
        t, meta = self.files["plain"]
        sha = hashlib.sha256(Path(self.dense, "model.safetensors").read_bytes()).hexdigest()
        import mlx_lm

        want = {"kvlab.golden": "1", "model": "llama_dense", "model_sha256": sha, "scenario": "plain",
                "scenario_line": "plain      prompts=13 steps=24", "engine": "mlx-lm",
                "engine_version": mlx_lm.__version__, "backend": "mlx-cpu", "kvlab_commit": "abc123",
                "sequences": "1", "layers": "4", "cache_classes": "KVCache,KVCache,KVCache,KVCache",
                "seq.0.status": "ok"}
        self.assertEqual(meta, want)
        self.assertEqual(self.files["prefix"][1]["seq.1.reused"], "10")

    def test_tensors(self):
        t, _ = self.files["plain"]
        self.assertEqual(sorted(t), sorted(["seq.0.prompt", "seq.0.tokens", "seq.0.logits"] +
                                           [f"seq.0.attn.{l}" for l in range(4)]))
        self.assertEqual(t["seq.0.prompt"].tolist(), gr.prompt_tokens(1, 0, 13, 256))
        self.assertEqual((t["seq.0.prompt"].dtype, t["seq.0.tokens"].dtype), (np.int32, np.int32))
        self.assertEqual(t["seq.0.tokens"].shape, (24,))
        self.assertEqual((t["seq.0.logits"].dtype, t["seq.0.logits"].shape), (np.float32, (24, 256)))
        self.assertEqual((t["seq.0.attn.2"].dtype, t["seq.0.attn.2"].shape), (np.float32, (24, 4 * 32)))

    def test_tokens_are_argmax(self):
        for name, (t, meta) in self.files.items():
            for i in range(int(meta["sequences"])):
                with self.subTest(name=name, seq=i):
                    self.assertEqual(t[f"seq.{i}.tokens"].tolist(), t[f"seq.{i}.logits"].argmax(-1).tolist())

    def test_plain_is_generate_step(self):
        t, _ = self.files["plain"]
        tokens, logits = _single(self.rp.model, t["seq.0.prompt"].tolist(), 24)
        self.assertEqual(tokens, t["seq.0.tokens"].tolist())
        np.testing.assert_array_equal(logits, t["seq.0.logits"])

    def test_attention_is_the_last_position_of_a_full_forward(self):
        t, _ = self.files["plain"]
        seq = t["seq.0.prompt"].tolist() + t["seq.0.tokens"].tolist()[:7]  # step 7's inputs
        with gr.Taps(self.rp.model) as taps:
            mx.eval(self.rp.model(mx.array(seq)[None]))
        for l in range(4):
            np.testing.assert_allclose(np.array(taps.calls[l][0][0]), t[f"seq.0.attn.{l}"][7], rtol=1e-5, atol=1e-6)
        self.assertFalse(isinstance(self.rp.model.layers[0].self_attn.o_proj, gr._Tap))  # unwrapped again

    def test_save_load_equals_plain(self):
        (p, _), (s, meta) = self.files["plain"], self.files["save_load"]
        self.assertEqual(meta["seq.0.status"], "ok")
        self.assertEqual(sorted(p), sorted(s))
        self.assertEqual(s["seq.0.tokens"].tolist(), p["seq.0.tokens"].tolist())
        for name in p:
            np.testing.assert_allclose(s[name], p[name], atol=1e-5, rtol=0, err_msg=name)

    def test_batch_matches_single_requests(self):
        t, meta = self.files["batch"]
        self.assertEqual(meta["sequences"], "4")
        self.assertFalse([k for k in t if ".attn." in k])  # no per-row hook in BatchGenerator
        sc = gr.parse_line("batch prompts=13,6,9 steps=16 finish=1@6 join=7@8")
        for i, (prompt, steps) in enumerate(zip(sc.request_prompts(256), (16, 6, 16, 16))):
            with self.subTest(seq=i):
                self.assertEqual(meta[f"seq.{i}.status"], "ok")
                self.assertEqual(t[f"seq.{i}.prompt"].tolist(), prompt)
                tokens, logits = _single(self.rp.model, prompt, steps)
                self.assertEqual(t[f"seq.{i}.tokens"].tolist(), tokens)
                np.testing.assert_allclose(t[f"seq.{i}.logits"], logits, atol=1e-4, rtol=0)

    def test_prefix_reuses_a_trimmed_cache(self):
        t, meta = self.files["prefix"]
        self.assertEqual(t["seq.1.prompt"].tolist()[:10], t["seq.0.prompt"].tolist()[:10])
        self.assertEqual(len(t["seq.1.prompt"]), 15)
        tokens, logits = _single(self.rp.model, t["seq.1.prompt"].tolist(), 12)
        self.assertEqual(t["seq.1.tokens"].tolist(), tokens)
        np.testing.assert_allclose(t["seq.1.logits"], logits, atol=1e-5, rtol=0)

    def test_kv_bits_on_hybrid_records_the_error_and_the_steps_before(self):
        rp = gr.Replayer(self.hybrid, "llama_hybrid")
        plain = rp.replay(gr.parse_line("plain prompts=13 steps=24"))
        r = rp.replay(gr.parse_line("kv8 prompts=13 steps=24 kv_bits=8 kv_group_size=32 quantized_kv_start=16"))
        (seq,) = r.sequences
        self.assertEqual(seq.status, "error: NotImplementedError: RotatingKVCache Quantization NYI")
        # The call over token 2 (producing step 3) brings the offset to 16; converting
        # the first layer, a RotatingKVCache, raises: steps 0..2 are complete.
        self.assertEqual(len(seq.tokens), 3)
        self.assertEqual(seq.tokens, plain.sequences[0].tokens[:3])
        self.assertEqual(r.cache_classes, ["RotatingKVCache", "KVCache", "RotatingKVCache", "KVCache"])
        out = Path(self.tmp.name, "out-hybrid")
        out.mkdir()
        path = rp.write(r, out)
        t, meta = _read(path)
        self.assertEqual(meta["seq.0.status"], seq.status)
        self.assertEqual((t["seq.0.tokens"].shape, t["seq.0.logits"].shape, t["seq.0.attn.0"].shape),
                         ((3,), (3, 256), (3, 128)))
        np.testing.assert_array_equal(t["seq.0.logits"], np.stack([np.array(x) for x in plain.sequences[0].logits[:3]]))


class TeacherForcing(unittest.TestCase):
    """--teacher: each step's input is the teacher's token; the record is the model's own
    greedy token and the logits of that forced input (kvlab golden record --teacher)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.dense = make_model_dir(GOLDEN / "models/llama_dense/config.json", root / "models/llama_dense")
        cls.scenarios = str(GOLDEN / "scenarios/llama_dense")
        cls.rp = gr.Replayer(cls.dense, "llama_dense")
        # A teacher whose tokens are not the model's: every greedy token shifted by one.
        plain = cls.rp.replay(gr.parse_line("plain prompts=13 steps=24"))
        cls.shifted = [(t + 1) % 256 for t in plain.sequences[0].tokens]
        teacher = gr.Sequence(plain.sequences[0].prompt, tokens=list(cls.shifted),
                              logits=list(plain.sequences[0].logits), attn=None)
        cls.teacher = root / "teacher.safetensors"
        gr.write_golden(cls.teacher, gr.golden_tensors([teacher], 256, []),
                        {"kvlab.golden": "1", "sequences": "1", "model_sha256": cls.rp.sha256})

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _golden(self, *extra):
        out = Path(self.tmp.name, "out")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = cli.main(["golden", "--model", self.dense, "--scenarios", self.scenarios, "--out", str(out), *extra])
        return rc, out

    def test_forced_inputs_give_the_logits_of_the_teachers_stream(self):
        rc, out = self._golden("--scenario", "plain", "--teacher", str(self.teacher))
        self.assertEqual(rc, 0)
        t, meta = _read(out / "llama_dense.plain.mlx-lm.safetensors")
        self.assertEqual(meta["teacher_forced"], "1")
        prompt = t["seq.0.prompt"].tolist()
        for step in (0, 1, 7, 23):  # step s sees the prompt and the teacher's first s tokens
            with self.subTest(step=step):
                logits = self.rp.model(mx.array(prompt + self.shifted[:step])[None])[0, -1]
                np.testing.assert_allclose(t["seq.0.logits"][step], np.array(logits), atol=1e-4, rtol=0)
        # What is recorded is the model's own choice under those inputs, not the teacher's.
        self.assertEqual(t["seq.0.tokens"].tolist(), t["seq.0.logits"].argmax(-1).tolist())
        self.assertNotEqual(t["seq.0.tokens"].tolist(), self.shifted)

    def test_save_load_and_prefix_are_forced_too(self):
        for name in ("save_load", "prefix"):
            sc = next(s for s in gr.read_scenarios(self.scenarios) if s.name == name)
            prompts = sc.request_prompts(256)
            teacher = [[(7 * i + j) % 256 for j in range(sc.steps)] for i in range(len(prompts))]
            r = self.rp.replay(sc, teacher)
            with self.subTest(name=name):
                self.assertTrue(r.teacher_forced)
                for i, seq in enumerate(r.sequences):
                    self.assertEqual(seq.status, "ok")
                    # The last step's logits are those of the prompt and every fed token.
                    logits = self.rp.model(mx.array(prompts[i] + teacher[i][: sc.steps - 1])[None])[0, -1]
                    np.testing.assert_allclose(np.array(seq.logits[-1]), np.array(logits), atol=1e-4, rtol=0)

    def test_unfit_teachers_are_refused(self):
        sc = gr.parse_line("plain prompts=13 steps=24")
        prompt = sc.request_prompts(256)[0]
        with self.assertRaisesRegex(ValueError, "runs 1 sequence"):
            gr.check_teacher(sc, 256, [])
        with self.assertRaisesRegex(ValueError, "another prompt"):
            gr.check_teacher(sc, 256, [(prompt[:-1], [0] * 24)])
        with self.assertRaisesRegex(ValueError, "has 3 tokens, the scenario feeds 23"):
            gr.check_teacher(sc, 256, [(prompt, [0] * 3)])
        with self.assertRaisesRegex(ValueError, "is a batch"):
            gr.check_teacher(gr.parse_line("b prompts=3,4 steps=2"), 256, [])
        rc, _ = self._golden("--teacher", str(self.teacher))  # which scenario?
        self.assertEqual(rc, 2)
        fifo = Path(self.tmp.name, "fifo")
        os.mkfifo(fifo)
        rc, _ = self._golden("--scenario", "plain", "--teacher", str(fifo))  # refused, not blocked
        self.assertEqual(rc, 2)


if __name__ == "__main__":
    unittest.main()
