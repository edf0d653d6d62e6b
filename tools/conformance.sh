#!/usr/bin/env bash
# kvlab's verdict on the real engines in one report:
#   1. the registers of known divergences (tools/registers.py);
#   2. per kernel: the mlx backend (MLX's C++ library) over the ci tier
#      (tools/conformance_table.py), when it is built;
#   3. per cache kind: kvlab's cache scripts replayed through mlx-lm's and mlx-vlm's cache
#      classes, and its prefix scripts through vllm-mlx's four prefix stores
#      (adapters/mlx/cache_replay.sh, vllm_mlx_replay.sh, tools/cache_replay_table.py,
#      tools/prefix_store_table.py);
#   4. llama.cpp: the ggml backend over the ci tier, its register's C repros, cell scripts
#      through llama.cpp's KV cache (adapters/llama/cell_replay.sh, tools/cell_replay_table.py)
#      with their repros (tools/llama/repro.sh), and the goldens through llama.cpp
#      (golden/replay_llama_cpp.sh); each part says why when its engine is absent.
# usage: tools/conformance.sh [--build DIR] [--work DIR] [--count N] [--mlx-lm VERSION]
# --mlx-lm VERSION replays the caches through another mlx-lm release, installed from PyPI
# into its own venv (build/venv-mlx-lm-VERSION, beside MLX 0.32.4); the registers describe
# the pinned 0.32.2, so there the run reports instead of failing: an entry that no longer
# reproduces is a divergence that release does not have, an unlisted one is new. Not in CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build/ci work=$root/build/conformance count=320 version=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --mlx-lm) version=$2; shift 2 ;;
    *) echo "conformance.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
kvlab=$build/tools/kvlab
[[ -x $kvlab ]] || { echo "conformance.sh: no kvlab at $kvlab (build the ci preset, or --build DIR)" >&2; exit 2; }
py=$root/build/venv/bin/python
[[ -x $py ]] || { echo "conformance.sh: no venv ($(cat "$root/build/venv.unavailable" 2>/dev/null || echo 'run tools/setup_venv.sh'))" >&2; exit 2; }
mkdir -p "$work"

echo "== registers of known divergences"
"$py" "$root/tools/registers.py"

if [[ -z $version ]]; then
  echo "== per kernel: the mlx backend over the ci tier"
  if "$kvlab" list | grep -q '^    here: mlx'; then
    "$kvlab" check --backend mlx --tier ci --progress never --json "$work/mlx.jsonl" > "$work/mlx.txt" || true
    tail -n 2 "$work/mlx.txt"
    "$py" "$root/tools/conformance_table.py" "$work/mlx.jsonl"
  else
    echo "(the mlx backend is not built here: $("$kvlab" list | grep -A1 '^  mlx' | tail -1 | sed 's/^ *//'))"
  fi
  echo "== per cache kind: mlx-lm $("$py" -c 'import importlib.metadata as m; print(m.version("mlx-lm"))')"
  status=0
  bash "$root/adapters/mlx/cache_replay.sh" "$kvlab" "$py" "$work/caches" ci "$count" 1 || status=1
  echo "== per cache kind: mlx-vlm $("$py" -c 'import importlib.metadata as m; print(m.version("mlx-vlm"))')"
  bash "$root/adapters/mlx/cache_replay.sh" "$kvlab" "$py" "$work/caches-mlx-vlm" ci "$count" 1 mlx-vlm || status=1
  stores=(vllm-mlx vllm-mlx-kvq vllm-mlx-manager vllm-mlx-paged)  # kvlab_mlx/engines.py VLLM_MLX_STORES
  for store in "${stores[@]}"; do
    echo "== per cache kind: vllm-mlx 0.6.0's prefix store $store (build/venv-vllm-mlx)"
    STORE=$store bash "$root/adapters/mlx/vllm_mlx_replay.sh" "$kvlab" "$work/prefix/$store" ci "$count" 1 || status=1
  done
  if [[ -f $work/prefix/vllm-mlx/judged.jsonl ]]; then
    echo "== vllm-mlx's prefix stores: store x kind x hit kind"
    "$py" "$root/tools/prefix_store_table.py" "${stores[@]/#/$work/prefix/}"
  fi
  echo "== per kernel: the ggml backend over the ci tier"
  if "$kvlab" list | grep -q '^    here: ggml'; then
    "$kvlab" check --backend ggml --tier ci --progress never --json "$work/ggml.jsonl" > "$work/ggml.txt" || status=1
    tail -n 2 "$work/ggml.txt"
    "$py" "$root/tools/conformance_table.py" "$work/ggml.jsonl"
    bash "$root/tools/ggml/repro.sh" || status=1
  else
    echo "(the ggml backend is not built here: $("$kvlab" list | grep -A1 '^  ggml' | tail -1 | sed 's/^ *//'))"
  fi
  llama=$build/adapters/llama/kvlab_golden_llama gguf_python=$root/build/ggml-venv/bin/python
  if [[ -x $llama ]]; then
    echo "== llama.cpp's KV cache: cell scripts, model x route ($count per row)"
    bash "$root/adapters/llama/cell_replay.sh" "$kvlab" "$llama" "$gguf_python" "$work/llama-cells" "$count" 1 || status=1
    bash "$root/tools/llama/repro.sh" "$kvlab" "$gguf_python" "$work/llama-repros" || status=1
    echo "== goldens through llama.cpp"
    bash "$root/golden/replay_llama_cpp.sh" "$kvlab" "$llama" "$gguf_python" "$work/llama-goldens" | grep -v '^llama_\|^gemma4' || status=1
  else
    echo "(llama.cpp's replays are not built here: no $llama; tools/ggml/engine.sh builds the library)"
  fi
  exit $status
fi

venv=$root/build/venv-mlx-lm-$version
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import mlx_lm" 2>/dev/null; then
  echo "== installing mlx-lm $version into $venv (PyPI)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "mlx[cpu]==0.32.4" "mlx-lm==$version" numpy safetensors \
    || { echo "conformance.sh: cannot install mlx-lm $version (network or version)" >&2; exit 2; }
fi
echo "== per cache kind: mlx-lm $version (registers describe 0.32.2: reported, not failed)"
KVLAB_REPLAY_REPORT_ONLY=1 bash "$root/adapters/mlx/cache_replay.sh" "$kvlab" "$venv/bin/python" "$work/caches-$version" ci "$count" 1
