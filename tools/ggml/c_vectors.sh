#!/usr/bin/env bash
# Vectors from ggml's own C (the cross-check of docs/quantization.md §ggml block formats):
#   tools/ggml/c_vectors.sh <llama.cpp ggml dir> [extra CFLAGS...]
# e.g. the ggml/ of llama-cpp-python 0.3.36's sdist (vendor/llama.cpp/ggml). Compiles
# ggml-quants.c as ggml-base is compiled (-O2, the compiler's default target: on x86-64
# no FMA, so nothing is contracted) with tools/ggml/ggml_c_vectors.c, feeds it the inputs
# of build/ggml/gguf_vectors.txt (tools/ggml/setup_venv.sh) and writes
# build/ggml/c_vectors.txt. Then:
#   KVLAB_GGML_VECTORS=build/ggml/c_vectors.txt build/asan/tests/test_unit --gtest_filter='GgmlGguf*'
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
ggml=${1:?usage: c_vectors.sh <llama.cpp ggml dir> [CFLAGS...]}
shift
out="$root/build/ggml"
[[ -f "$out/gguf_vectors.txt" ]] || { echo "run tools/ggml/setup_venv.sh first" >&2; exit 1; }
cc=${CC:-cc}
"$cc" -O2 -std=gnu11 "$@" -I"$ggml/include" -I"$ggml/src" "$ggml/src/ggml-quants.c" \
  "$root/tools/ggml/ggml_c_vectors.c" -lm -o "$out/ggml_c_vectors"
"$out/ggml_c_vectors" <"$out/gguf_vectors.txt" >"$out/c_vectors.txt"
echo "c_vectors: $(wc -l <"$out/c_vectors.txt") blocks in build/ggml/c_vectors.txt"
