#!/usr/bin/env bash
# An engine's own cache classes against kvlab's cache oracle (CTests
# conformance.cache_replay_mlx_lm and conformance.cache_replay_mlx_vlm): ENGINE is one of
# kvlab_mlx/engines.py (mlx-lm by default, mlx-vlm), its registers
# harness/known/ENGINE-caches and ENGINE-caches.adapter.
#   1. the problems: the cache op's tier (default ci) and COUNT seeded random scripts per
#      kind the engine has (python -m kvlab_mlx scripts --engine ENGINE);
#   2. kvlab vectors write: flat q/k/v in, kvlab's observables out (reference backend);
#   3. kvlab_mlx run: kvlab_mlx/cache_replay.py drives KVCache, RotatingKVCache,
#      QuantizedKVCache, ChunkedKVCache, BatchKVCache, BatchRotatingKVCache (and mlx-vlm's
#      BatchQuantizedKVCache) as a model layer does; where the engine raises (or its
#      content differs in length) the finding is judged against the .adapter register;
#   4. kvlab check --vectors: every output judged by the oracle under the cache op's
#      policy, with the register harness/known/ENGINE-caches;
#   5. tools/cache_replay_table.py: per kind, scripts replayed and divergences by class.
# An unlisted divergence fails, and so does a register entry that no longer reproduces
# (KVLAB_REPLAY_REPORT_ONLY=1: both are printed and the table still comes, for another
# mlx-lm release than the registers describe: tools/conformance.sh --mlx-lm VERSION).
# usage: cache_replay.sh KVLAB PYTHON WORKDIR [TIER] [COUNT] [SEED] [ENGINE]
set -euo pipefail
kvlab=$1 py=$2 work=$3 tier=${4:-ci} count=${5:-320} seed=${6:-1} engine=${7:-mlx-lm}
root=$(cd "$(dirname "$0")/../.." && pwd)
known="$root/harness/known/$engine-caches"
if [[ ! -f $known || ! -f $known.adapter ]]; then
  echo "cache_replay: no registers for engine '$engine' ($known and $known.adapter)" >&2
  exit 2
fi
tag=${engine//-/_}
status=0
verdict() {  # a failed judgement: stop, or (report-only) note it and go on
  { grep -E -A1 'UNLISTED' "$1"
    grep -E '^(FAILED|INVALID) |^  (reason|repro):|STALE|known divergences|^kvlab check|^computed|FAILED cache' "$1"
  } | head -n 400 || true
  [[ ${KVLAB_REPLAY_REPORT_ONLY:-0} == 1 ]] || exit 1
  status=1
}
export PYTHONPATH="$root/adapters/mlx"
mkdir -p "$work"
"$py" -m kvlab_mlx scripts --count "$count" --seed "$seed" --engine "$engine" -o "$work/random.cases"
"$kvlab" vectors write --tier "$tier" --op cache -o "$work/tier.kvlab.safetensors"
"$kvlab" vectors write --cases "$work/random.cases" -o "$work/random.kvlab.safetensors"
reports=() outputs=()
for part in tier random; do
  "$py" -m kvlab_mlx run "$work/$part.kvlab.safetensors" -o "$work/$part.$tag.safetensors" --cache-engine "$engine" \
    --report-json "$work/$part.replay.json" > "$work/$part.replay.txt" || verdict "$work/$part.replay.txt"
  grep -v -e '^  skipped' -e '^  MLX raised' "$work/$part.replay.txt"
  reports+=("$work/$part.replay.json")
  # a part whose every problem became a finding has nothing for kvlab check to judge
  grep -q "^wrote .*: 0 problems" "$work/$part.replay.txt" || outputs+=("$work/$part.$tag.safetensors")
done
"$py" -m kvlab_mlx findings "${reports[@]}" --known-findings "$known.adapter" \
  > "$work/findings.txt" && cat "$work/findings.txt" || verdict "$work/findings.txt"
"$kvlab" check --vectors "${outputs[@]}" --known "$known" \
  --json "$work/judged.jsonl" > "$work/judged.txt" && tail -n 6 "$work/judged.txt" || verdict "$work/judged.txt"
"$py" "$root/tools/cache_replay_table.py" "${reports[@]}" "$work/judged.jsonl" ${KVLAB_PREFIX_HITS:+--hits "$KVLAB_PREFIX_HITS"}
if [[ $status != 0 ]]; then
  echo "cache_replay: report only: the run above differs from the registers (they describe the pinned $engine)"
fi
