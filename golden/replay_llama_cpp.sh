#!/usr/bin/env bash
# The checked-in goldens against llama.cpp (CTest golden.replay_llama_cpp), through the
# llama.cpp library vendored in the pinned llama-cpp-python sdist (tools/ggml/engine.sh):
#   1. kvlab golden models: the tiny models as folders (hash-checked);
#   2. adapters/llama/gguf_model.py: each written as a GGUF with the vendored gguf-py
#      (llama_dense as `llama`, llama_hybrid as `granite_swa`); a model it cannot express
#      (exit 3) gets a not-replayed marker per scenario with its reason;
#   3. kvlab_golden_llama: every scenario through llama_decode and llama_memory_* (one
#      unified cell pool, one sequence per request), written as goldens in kvlab's format;
#   4. tools/golden_table.py replay --engine llama.cpp: kvlab golden diff of each
#      checked-in golden against llama.cpp's, judged by the register golden/known/llama.cpp
#      (an unlisted divergence or a stale entry fails).
# usage: replay_llama_cpp.sh KVLAB KVLAB_GOLDEN_LLAMA PYTHON WORKDIR
set -euo pipefail
kvlab=$1 driver=$2 py=$3 work=$4
root=$(cd "$(dirname "$0")/.." && pwd)
gguf_py="$root/build/ggml-engine/src/llama.cpp/gguf-py"
if [[ ! -x $py ]]; then
  echo "SKIPPED: no Python with numpy at $py (tools/ggml/setup_venv.sh builds build/ggml-venv)"
  exit 0
fi
if [[ ! -d $gguf_py ]]; then
  echo "SKIPPED: no vendored gguf-py at $gguf_py (tools/ggml/engine.sh unpacks it)"
  exit 0
fi
rm -rf "$work/llama.cpp" "$work/gguf"
mkdir -p "$work/llama.cpp" "$work/gguf"
"$kvlab" golden models --models "$work/models"
for scenarios in "$root"/golden/scenarios/*; do
  id=$(basename "$scenarios")
  model="$work/models/$id"
  set +e
  why=$(PYTHONPATH="$gguf_py" "$py" "$root/adapters/llama/gguf_model.py" "$model" "$work/gguf/$id.gguf" 2>&1)
  rc=$?
  set -e
  if [[ $rc -eq 3 ]]; then
    for name in $(grep -v '^\s*#' "$scenarios" | awk 'NF { print $1 }'); do
      echo "GGUF writer: ${why#unsupported: }" >"$work/llama.cpp/$id.$name.llama.cpp.not-replayed"
    done
    echo "$id: not replayed: $why"
    continue
  fi
  [[ $rc -eq 0 ]] || { echo "$why" >&2; exit 1; }
  sha=$(cut -d' ' -f1 "$model/model.kvlab-generated")
  "$driver" --gguf "$work/gguf/$id.gguf" --model-id "$id" --model-sha256 "$sha" --scenarios "$scenarios" \
    --out "$work/llama.cpp" 2> >(grep -v 'adding .* dummy tokens' >&2)
done
"$py" "$root/tools/golden_table.py" replay --kvlab "$kvlab" --golden-dir "$root/golden" --replays "$work/llama.cpp" \
  --engine llama.cpp --known "$root/golden/known/llama.cpp" --json "$work/replay.json"
