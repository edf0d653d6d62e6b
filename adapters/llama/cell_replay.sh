#!/usr/bin/env bash
# The cell-script replay through llama.cpp (CTest conformance.cache_replay_llama_cpp;
# docs/engines.md §llama.cpp): COUNT random cell scripts (golden/files/cell_script.h) per
# model and route, each through kvlab's oracle and through llama.cpp, every output
# compared (kvlab_golden_llama cells), then judged by harness/known/llama.cpp-cells.adapter
# (tools/cell_replay_table.py: an unlisted finding or a stale entry fails). Routes:
#   direct              llama.cpp's verbs as they are;
#   div-as-add          seq_div sent as the seq_add calls giving the same positions;
#   div-as-add+per-cell the oracle with llama.cpp's one position per cell as well: where
#                       the register's upstream entries do not apply, so every finding
#                       there must be representation.
# usage: cell_replay.sh KVLAB KVLAB_GOLDEN_LLAMA PYTHON WORKDIR [COUNT [SEED]]
set -euo pipefail
kvlab=$1 driver=$2 py=$3 work=$4 count=${5:-100} seed=${6:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
gguf_py="$root/build/ggml-engine/src/llama.cpp/gguf-py"
if [[ ! -x $py || ! -d $gguf_py ]]; then
  echo "SKIPPED: no Python with numpy at $py or no vendored gguf-py at $gguf_py (tools/ggml/setup_venv.sh, tools/ggml/engine.sh)"
  exit 0
fi
rm -rf "$work/results"
mkdir -p "$work/results" "$work/gguf"
"$kvlab" golden models --models "$work/models" >/dev/null
for id in llama_dense llama_hybrid; do
  PYTHONPATH="$gguf_py" "$py" "$root/adapters/llama/gguf_model.py" "$work/models/$id" "$work/gguf/$id.gguf"
  for route in "" "--div-as-add 1" "--div-as-add 1 --positions per-cell"; do
    # shellcheck disable=SC2086  # route is a list of options
    "$driver" cells --model-dir "$work/models/$id" --gguf "$work/gguf/$id.gguf" --model-id "$id" --seed "$seed" \
      --count "$count" $route --json "$work/results/$id.$(echo "${route:-direct}" | tr -c 'a-z0-9\n' '_').jsonl" \
      2> >(grep -v 'adding .* dummy tokens' >&2) | tail -1
  done
done
"$py" "$root/tools/cell_replay_table.py" "$work"/results/*.jsonl --known "$root/harness/known/llama.cpp-cells.adapter" \
  --markdown "$work/table.md"
