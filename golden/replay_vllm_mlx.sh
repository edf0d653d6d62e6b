#!/usr/bin/env bash
# The checked-in goldens against vllm-mlx (CTest golden.replay_vllm_mlx), in vllm-mlx's own
# venv (build/venv-vllm-mlx, tools/setup_venv_vllm_mlx.sh: vllm-mlx 0.6.0 on mlx-lm 0.31.3):
#   1. kvlab golden models: the tiny models as folders (hash-checked), which mlx-lm 0.31.3's
#      load_model reads unchanged (model_type llama / gemma4_text; vllm-mlx routes such a
#      text-only folder to its LLM Scheduler, not its MLLM one);
#   2. python -m kvlab_mlx golden-vllm: every scenario vllm-mlx can express through its
#      continuous-batching Scheduler in process (add_request / step / abort_request over
#      mlx-lm's BatchGenerator, its MemoryAwarePrefixCache, its max_kv_size bound), written
#      as goldens in kvlab's format (adapters/mlx/kvlab_mlx/golden_replay_vllm.py); kv_bits
#      and save_at scenarios get a not-replayed marker with the reason; each request's
#      reused prefix length is checked against its kvlab golden's (--golden-dir); and four
#      concurrent requests of the plain prompt under each global kv-cache quantization
#      setting (SwiftLM's Test 9 as far as vllm-mlx reaches: it takes no per-request
#      kv_bits), each row judged against kvlab's plain golden (--concurrent-out);
#   3. tools/golden_table.py replay --engine vllm-mlx: kvlab golden diff of each checked-in
#      golden against vllm-mlx's, judged by the register golden/known/vllm-mlx (an unlisted
#      divergence or a stale entry fails).
# usage: replay_vllm_mlx.sh KVLAB PYTHON WORKDIR
set -euo pipefail
kvlab=$1 py=$2 work=$3
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/adapters/mlx"
# The venv may be missing (tools/setup_venv_vllm_mlx.sh could not build it): skip with the reason.
if [[ ! -x $py ]]; then
  venv=$(dirname "$(dirname "$py")")
  echo "SKIPPED: no vllm-mlx venv at $venv: $(cat "$venv.unavailable" 2>/dev/null || echo 'run tools/setup_venv_vllm_mlx.sh')"
  exit 0
fi
if ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm_mlx") is None)'; then
  echo "SKIPPED: vllm-mlx is not installed in $py's venv (tools/setup_venv_vllm_mlx.sh)"
  exit 0
fi
rm -rf "$work/vllm-mlx" "$work/vllm-mlx-concurrent"
mkdir -p "$work/vllm-mlx"
"$kvlab" golden models --models "$work/models"
for scenarios in "$root"/golden/scenarios/*; do
  id=$(basename "$scenarios")
  "$py" -m kvlab_mlx golden-vllm --model "$work/models/$id" --model-id "$id" --scenarios "$scenarios" \
    --out "$work/vllm-mlx" --golden-dir "$root/golden/data" --concurrent-out "$work/vllm-mlx-concurrent" --kvlab "$kvlab"
done
"$py" "$root/tools/golden_table.py" replay --kvlab "$kvlab" --golden-dir "$root/golden" --replays "$work/vllm-mlx" \
  --engine vllm-mlx --known "$root/golden/known/vllm-mlx" --json "$work/replay.json"
