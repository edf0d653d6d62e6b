# Known divergences of llama.cpp (vendored in llama-cpp-python 0.3.36, tools/ggml/engine.lock)
# from kvlab's goldens: the scenarios of golden/scenarios replayed through llama.cpp's own
# library on a GGUF of the same model (golden/replay_llama_cpp.sh, CTest
# golden.replay_llama_cpp; adapters/llama/golden_llama.cc says how each scenario key becomes
# llama_decode and llama_memory_* calls). Format as golden/known/mlx-lm. An unlisted
# divergence or an entry that no longer matches fails the test.
#
# Not replayed (no entry; tools/golden_table.py prints the reason as the row's status):
# gemma4_small (kvlab has no GGUF writer for gemma4_text's per-layer inputs and KV-shared
# layers).
#
# L1: kv_bits=8/4 are llama.cpp's cache types q8_0/q4_0 (blocks of 32 with one f16 scale,
# no zero point, docs/quantization.md §ggml block formats) for every cached token from the
# first, and its flash attention quantizes q to q8_0 against a q8_0/q4_0 K (harness/known/ggml
# G4); kvlab's kv8/kv4 are mlx-lm's affine 8/4-bit groups of 32 from token 16 on. So the
# goldens part at step 0, where kvlab's cache is still unquantized (prompt 13 <
# quantized_kv_start 16) and llama.cpp's is not. The same machinery agrees where the formats
# do: every unquantized scenario of both models (plain, window, batch, prefix, save_load,
# device_batch) passes at max |dlogit| <= 2e-5 against an f32 cache.
llama.cpp | golden model=llama_dense,llama_hybrid scenario=kv8,kv4 raise~=seq.0.step.0.layer.0 | representation | llama.cpp quantizes the whole cache (q8_0/q4_0, absmax blocks of 32) and q against it from the first token; kvlab's kv8/kv4 are affine groups of 32 from token 16, so the goldens part at step 0 (L1)
