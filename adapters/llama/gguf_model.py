#!/usr/bin/env python3
"""A golden model folder (golden/README.md "Models": config.json + mlx-lm-named F32
safetensors) written as a GGUF file llama.cpp loads, with the gguf-py vendored in the
pinned llama.cpp (so the keys and architecture names are those of the engine built).

    gguf_model.py MODEL_DIR OUT.gguf      (PYTHONPATH: the vendored gguf-py)

Architectures:
- llama_dense (`llama`, no layer_types): llama.cpp's `llama`.
- llama_hybrid (`llama` with sliding/full layer_types): llama.cpp's `llama` has no sliding
  window, so the file is a `granite_swa` model, whose graph is llama's plus four Granite
  knobs, each set to leave llama's arithmetic unchanged: embedding and residual scales
  absent (0 = not applied), logit scale 1, attention scale absent (1/sqrt(head_dim)), and
  a per-head attention sink of -1e30 (exp(-1e30 - m) is 0 in f32 for every finite score
  max m, so the softmax denominators are unchanged).
- anything else (gemma4_text) is refused with the reason: its per-layer inputs and KV
  sharing have no writer here.

Every tensor stays F32. q_proj/k_proj rows are reordered per head from mlx-lm's
half-split RoPE pairs (i, i + d/2) to llama.cpp's adjacent pairs (2i, 2i+1) (llama.cpp's
`llama` runs its NORM RoPE); the same reordering of q and k leaves every q.k product a
sum of the same terms, and V, hence the attention output, is not reordered.
Exit status 3 with "unsupported: <reason>" on stderr for a model this cannot express.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "ggml"))
from gguf_modules import gguf_modules  # noqa: E402


def load_gguf():
    """gguf.constants and gguf.gguf_writer (tools/ggml/gguf_modules.py)."""
    return gguf_modules("constants", "gguf_writer")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"gguf_model.py: {path}: {name} is {info['dtype']}, expected F32")
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4").reshape(info["shape"])
    return out


def rope_pairs_adjacent(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of each head from (first halves, second halves) to interleaved pairs."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(rows, cols).copy()


def unsupported(reason: str) -> None:
    print(f"unsupported: {reason}", file=sys.stderr)
    raise SystemExit(3)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    model_dir, out = Path(argv[1]), Path(argv[2])
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        unsupported(f"model_type {cfg.get('model_type')!r}: only llama has a GGUF writer in kvlab")
    if not cfg.get("tie_word_embeddings", False):
        unsupported("untied output weights are not written")
    if cfg.get("rope_traditional", False):
        unsupported("rope_traditional=true (already adjacent pairs) is not written")
    constants, writer = load_gguf()
    w = read_safetensors(model_dir / "model.safetensors")

    layers = cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    types_ = cfg.get("layer_types")
    sliding = types_ is not None and "sliding_attention" in types_
    arch = "granite_swa" if sliding else "llama"

    g = writer.GGUFWriter(str(out), arch)
    g.add_name(model_dir.name)
    g.add_context_length(cfg.get("max_position_embeddings", 4096))
    g.add_embedding_length(cfg["hidden_size"])
    g.add_block_count(layers)
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(heads)
    g.add_head_count_kv(kv_heads)
    g.add_key_length(head_dim)
    g.add_value_length(head_dim)
    g.add_rope_dimension_count(head_dim)
    g.add_rope_freq_base(float(cfg["rope_theta"]))
    g.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    g.add_vocab_size(cfg["vocab_size"])
    g.add_file_type(constants.LlamaFileType.ALL_F32)
    # No tokenizer: kvlab feeds token ids (llama.cpp adds vocab_size dummy tokens).
    g.add_tokenizer_model("none")
    if sliding:
        g.add_sliding_window(cfg["sliding_window"])
        g.add_sliding_window_pattern([t == "sliding_attention" for t in types_])
        g.add_logit_scale(1.0)

    def put(name: str, a: np.ndarray) -> None:
        g.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))

    put("token_embd.weight", w["model.embed_tokens.weight"])
    put("output_norm.weight", w["model.norm.weight"])
    for i in range(layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", rope_pairs_adjacent(w[p + "self_attn.q_proj.weight"], heads))
        put(f"blk.{i}.attn_k.weight", rope_pairs_adjacent(w[p + "self_attn.k_proj.weight"], kv_heads))
        put(f"blk.{i}.attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", w[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        put(f"blk.{i}.ffn_gate.weight", w[p + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", w[p + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", w[p + "mlp.down_proj.weight"])
        if sliding:
            put(f"blk.{i}.attn_sinks.weight", np.full(heads, -1e30, dtype=np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
