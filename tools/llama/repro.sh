#!/usr/bin/env bash
# The standalone C repros of harness/known/llama.cpp-cells.adapter (tools/llama/repro/
# u<N>_*.c, one per upstream-bug entry U<N>), compiled against the llama.cpp library of
# tools/ggml/engine.sh and run on golden llama_dense as a GGUF (adapters/llama/gguf_model.py,
# vendored gguf-py); each exits 0 while its divergence reproduces. One line per repro; fails
# when one does not reproduce or does not build.
#   tools/llama/repro.sh KVLAB PYTHON WORKDIR
set -uo pipefail
kvlab=$1 py=$2 work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
engine=$root/build/ggml-engine
gguf_py=$engine/src/llama.cpp/gguf-py
[[ -f "$engine/install/lib/libllama.a" ]] || { echo "SKIPPED: no llama.cpp library in $engine (tools/ggml/engine.sh)"; exit 0; }
[[ -x $py && -d $gguf_py ]] || { echo "SKIPPED: no Python with numpy at $py or no gguf-py at $gguf_py"; exit 0; }
mkdir -p "$work"
"$kvlab" golden models --models "$work/models" >/dev/null || exit 1
PYTHONPATH=$gguf_py "$py" "$root/adapters/llama/gguf_model.py" "$work/models/llama_dense" "$work/llama_dense.gguf" || exit 1
lib=$engine/install/lib
status=0
for src in "$root"/tools/llama/repro/u*.c; do
  name=$(basename "$src" .c)
  # libllama and ggml-cpu are C++: link with the C++ driver.
  if ! ${CC:-cc} -O1 -std=gnu11 -I"$engine/install/include" -c "$src" -o "$work/$name.o" ||
     ! ${CXX:-c++} "$work/$name.o" "$lib/libllama.a" "$lib/libggml.a" "$lib/libggml-cpu.a" "$lib/libggml-base.a" \
       -lm -lpthread -o "$work/$name"; then
    echo "$name: does not build"; status=1; continue
  fi
  "$work/$name" "$work/llama_dense.gguf" >"$work/$name.txt" 2>&1
  rc=$?
  echo "$name: $(tail -1 "$work/$name.txt")"
  [[ $rc -eq 0 ]] || status=1
done
exit $status
