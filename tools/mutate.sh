#!/usr/bin/env bash
# Mutation testing (docs/mutation.md): runs tools/mutate.py in the pinned universalmutator
# venv (tools/mutate/setup_venv.sh, called by tools/setup.sh), niced. Without the venv it
# exits 77 with the reason (the mutation-deep label skips on 77).
#   bash tools/mutate.sh --diff origin/main --time-box 15
#   bash tools/mutate.sh --sample 300 --seed 47
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/build/mutate-venv/bin/python"
if ! [[ -x "$py" ]]; then
  bash "$root/tools/mutate/setup_venv.sh" >&2
fi
if ! [[ -x "$py" ]]; then
  echo "mutate: no universalmutator venv: $(cat "$root/build/mutate-venv.unavailable" 2>/dev/null || echo 'see tools/mutate/setup_venv.sh')" >&2
  exit 77
fi
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
exec nice -n 10 "$py" "$root/tools/mutate.py" "$@"
