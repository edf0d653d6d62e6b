#!/usr/bin/env bash
# CTest golden.own_model: an engine developer's own model folder, as golden/README.md
# "Your own model" tells it. A folder kvlab did not write (here: a copy of a generated
# model under another name, with no stamp) and a scenario file of one's own:
#   1. kvlab golden record --model-dir: goldens through kvlab's forward pass on two
#      backends, and kvlab golden diff --scenarios judges them with that file's tolerance;
#   2. the same folder given as --models for a checked-in id is refused, never overwritten;
#   3. with PYTHON (the pinned venv), mlx-lm's replay of the same folder
#      (python -m kvlab_mlx golden), free-running and teacher-forced by kvlab's golden,
#      diffed against kvlab's.
# The folder must be byte-identical at the end.
# usage: own_model.sh KVLAB WORKDIR [PYTHON]
set -euo pipefail
kvlab=$1 work=$2 py=${3:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
cd "$work"

"$kvlab" golden models --model llama_hybrid --models generated > /dev/null
mkdir my_model
cp generated/llama_hybrid/config.json generated/llama_hybrid/model.safetensors my_model/
before=$(sha256sum my_model/* | sha256sum)
# The model id written in the goldens is the scenario file's name (as the adapter's).
mkdir scenarios
cat > scenarios/my_model <<'SCENARIOS'
plain     prompts=9 steps=12
save_load prompts=9 steps=12 save_at=4 max_dlogit=2e-3
kv4       prompts=9 steps=12 kv_bits=4 kv_group_size=32 quantized_kv_start=10
SCENARIOS

echo "== 1. kvlab's forward pass over the folder"
"$kvlab" golden record --model-dir my_model --scenarios scenarios/my_model --scenario plain -o kvlab.plain.golden
"$kvlab" golden record --model-dir my_model --scenarios scenarios/my_model --scenario save_load -o kvlab.save_load.golden
"$kvlab" golden record --model-dir my_model --scenarios scenarios/my_model --scenario plain --backend simd \
  -o simd.plain.golden 2>&1 || "$kvlab" golden record --model-dir my_model --scenarios scenarios/my_model --scenario plain \
  -o simd.plain.golden  # no SIMD backend built: the reference again
"$kvlab" golden diff kvlab.plain.golden simd.plain.golden --scenarios scenarios/my_model | tee diff.txt
grep -F "(from scenarios/my_model 'plain')" diff.txt
grep -F "model my_model sha256 $(sha256sum my_model/model.safetensors | cut -c1-64)" diff.txt
"$kvlab" golden diff kvlab.save_load.golden kvlab.plain.golden --scenarios scenarios/my_model | tee diff2.txt
grep -F "max|dlogit| 0.001" diff2.txt  # the stricter of plain's and save_load's

echo "== 2. the folder as --models of a checked-in id: refused, untouched"
mkdir -p theirs && cp -r my_model theirs/llama_dense
if "$kvlab" golden models --model llama_dense --models theirs 2> refused.txt; then
  echo "kvlab accepted weights it did not write"; exit 1
fi
cat refused.txt
grep -F "was not written by kvlab" refused.txt
cmp theirs/llama_dense/model.safetensors my_model/model.safetensors

if [[ -n $py ]]; then
  echo "== 3. mlx-lm's replay of the folder, free-running and teacher-forced"
  export PYTHONPATH="$root/adapters/mlx"
  "$py" -m kvlab_mlx golden --model my_model --scenarios scenarios/my_model --out mlx
  "$kvlab" golden diff kvlab.plain.golden mlx/my_model.plain.mlx-lm.safetensors --scenarios scenarios/my_model
  "$kvlab" golden diff kvlab.save_load.golden mlx/my_model.save_load.mlx-lm.safetensors --scenarios scenarios/my_model
  # A teacher whose tokens are not plain's own (the 4-bit cache's stream, same prompt):
  # both engines fed the same inputs, compared over every step.
  "$kvlab" golden record --model-dir my_model --scenarios scenarios/my_model --scenario kv4 -o kvlab.kv4.golden
  "$kvlab" golden diff kvlab.plain.golden kvlab.kv4.golden --scenarios scenarios/my_model --json > streams.json || true
  grep -E '"first_token_divergence": [0-9]' streams.json \
    || { echo "the teacher's stream is plain's own: forcing would prove nothing"; exit 1; }
  "$kvlab" golden record --model-dir my_model --scenarios scenarios/my_model --scenario plain --teacher kvlab.kv4.golden \
    -o kvlab.forced.golden
  "$py" -m kvlab_mlx golden --model my_model --scenarios scenarios/my_model --scenario plain --teacher kvlab.kv4.golden \
    --out mlx-forced
  "$kvlab" golden diff kvlab.forced.golden mlx-forced/my_model.plain.mlx-lm.safetensors --scenarios scenarios/my_model
fi

after=$(sha256sum my_model/* | sha256sum)
[[ $before == "$after" && ! -e my_model/model.kvlab-generated ]] || { echo "my_model was modified"; exit 1; }
echo "own model: ok"
