"""The mlx-vlm golden replay (kvlab_mlx/golden_replay_vlm.py) on a stand-in llama_dense
folder, and golden_table.py's not-replayed markers."""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
from safetensors import safe_open

from kvlab_mlx import __main__ as cli

from golden_synth import make_model_dir

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "golden"


def _read(path):
    with safe_open(str(path), "numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


class VlmEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.dense = make_model_dir(GOLDEN / "models/llama_dense/config.json", root / "models/llama_dense")
        scen = root / "llama_dense"
        scen.write_text("plain prompts=13 steps=24\nkv8 prompts=13 steps=24 kv_bits=8 kv_group_size=32 "
                        "quantized_kv_start=16\nbatch prompts=13,6,9 steps=8 finish=1@3 join=7@4\n"
                        "prefix prompts=14 steps=4 prefix=10 second=5\nsave_load prompts=13 steps=12 save_at=5\n")
        cls.vlm, cls.lm = root / "vlm", root / "lm"
        out = io.StringIO()
        with mock.patch.dict(os.environ, {"KVLAB_COMMIT": "abc123"}), contextlib.redirect_stdout(out):
            rc_vlm = cli.main(["golden-vlm", "--model", cls.dense, "--scenarios", str(scen), "--out", str(cls.vlm)])
            rc_lm = cli.main(["golden", "--model", cls.dense, "--scenarios", str(scen), "--scenario", "plain", "kv8", "batch", "prefix",
                              "--out", str(cls.lm)])
        cls.printed = out.getvalue()
        assert rc_vlm == 0 and rc_lm == 0, cls.printed

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_files(self):
        self.assertEqual(sorted(p.name for p in self.vlm.iterdir()),
                         ["llama_dense.batch.mlx-vlm.safetensors", "llama_dense.kv8.mlx-vlm.safetensors",
                          "llama_dense.plain.mlx-vlm.safetensors", "llama_dense.prefix.mlx-vlm.safetensors",
                          "llama_dense.save_load.mlx-vlm.safetensors"])

    def test_metadata_names_mlx_vlm(self):
        _, meta = _read(self.vlm / "llama_dense.kv8.mlx-vlm.safetensors")
        self.assertEqual((meta["engine"], meta["model"], meta["scenario"], meta["seq.0.status"]),
                         ("mlx-vlm", "llama_dense", "kv8", "ok"))
        self.assertEqual(meta["cache_classes"], ",".join(["QuantizedKVCache"] * 4))  # its kv_bits route ran
        self.assertRegex(meta["engine_version"], r"^\d+\.\d+")

    def test_same_tensors_as_mlx_lm(self):
        # Not evidence that either is right: the two engines share this model and cache code.
        for name in ("plain", "kv8"):
            v, _ = _read(self.vlm / f"llama_dense.{name}.mlx-vlm.safetensors")
            l, _ = _read(self.lm / f"llama_dense.{name}.mlx-lm.safetensors")
            self.assertEqual(sorted(v), sorted(l))
            for k in v:
                np.testing.assert_array_equal(v[k], l[k], err_msg=f"{name} {k}")

    def test_batch_as_mlx_lm_batch(self):
        # Both BatchGenerators, the leaver and the joiner: the same tokens, and logits
        # within float noise (bit for bit on the pinned wheels, which neither promises).
        v, vm = _read(self.vlm / "llama_dense.batch.mlx-vlm.safetensors")
        l, lm = _read(self.lm / "llama_dense.batch.mlx-lm.safetensors")
        self.assertEqual((vm["sequences"], vm["seq.1.status"]), ("4", "ok"))
        self.assertEqual([len(v[f"seq.{i}.tokens"]) for i in range(4)], [8, 3, 8, 8])
        self._assert_same_sequences(v, l, 4)

    def _assert_same_sequences(self, v, l, count):
        """mlx-vlm's and mlx-lm's goldens: the same tokens, logits within float noise."""
        for i in range(count):
            self.assertEqual(v[f"seq.{i}.tokens"].tolist(), l[f"seq.{i}.tokens"].tolist())
            np.testing.assert_allclose(v[f"seq.{i}.logits"], l[f"seq.{i}.logits"], atol=1e-4, rtol=0)

    def test_prefix_reuses_ten_tokens_as_mlx_lm(self):
        v, vm = _read(self.vlm / "llama_dense.prefix.mlx-vlm.safetensors")
        l, lm = _read(self.lm / "llama_dense.prefix.mlx-lm.safetensors")
        self.assertEqual((vm["seq.1.reused"], lm["seq.1.reused"]), ("10", "10"))
        self._assert_same_sequences(v, l, 2)

    def test_save_load_continues_plain(self):
        # Through from_state at token 5, the first 12 steps are plain's (same prompt).
        p, _ = _read(self.vlm / "llama_dense.plain.mlx-vlm.safetensors")
        s, meta = _read(self.vlm / "llama_dense.save_load.mlx-vlm.safetensors")
        self.assertEqual(meta["seq.0.status"], "ok")
        self.assertEqual(s["seq.0.tokens"].tolist(), p["seq.0.tokens"].tolist()[:12])
        np.testing.assert_allclose(s["seq.0.logits"], p["seq.0.logits"][:12], atol=1e-5, rtol=0)

    def test_tokens_are_argmax(self):
        t, _ = _read(self.vlm / "llama_dense.plain.mlx-vlm.safetensors")
        self.assertEqual(t["seq.0.tokens"].tolist(), t["seq.0.logits"].argmax(-1).tolist())


class NotReplayedMarkers(unittest.TestCase):
    """A marker is a row 'not replayed' with its reason and no finding; a marker beside a
    replay file is a finding. No diff runs for a marked scenario (--kvlab is never called)."""

    def _run(self, with_file: bool):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "golden/scenarios").mkdir(parents=True)
            (root / "golden/scenarios/m").write_text("batch prompts=3,2 steps=2\n")
            (root / "r").mkdir()
            (root / "r/m.batch.eng.not-replayed").write_text("no batch driver\n")
            if with_file:
                (root / "r/m.batch.eng.safetensors").write_bytes(b"")
            out = subprocess.run([sys.executable, str(REPO / "tools/golden_table.py"), "replay", "--kvlab", "/bin/false",
                                  "--golden-dir", str(root / "golden"), "--replays", str(root / "r"), "--engine", "eng",
                                  "--json", str(root / "rows.json")], capture_output=True, text=True)
            rows = json.loads((root / "rows.json").read_text())
        return out, rows

    def test_marker_is_a_row_without_finding(self):
        out, rows = self._run(False)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertEqual([(r["verdict"], r["statuses"]) for r in rows], [("not replayed", ["no batch driver"])])

    def test_marker_beside_a_replay_is_a_finding(self):
        out, _ = self._run(True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("both a replay and a not-replayed marker", out.stdout)


if __name__ == "__main__":
    unittest.main()
