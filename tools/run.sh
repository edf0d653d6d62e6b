#!/usr/bin/env bash
# The main job: installs dependencies, builds the release CLI and runs it.
# Extra arguments go to `kvlab` (default: check --tier ci).
set -euo pipefail
cd "$(dirname "$0")/.."
# Let ccache reuse objects across clones in different directories.
export CCACHE_BASEDIR="$PWD"
bash tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target kvlab >/dev/null
if (($# == 0)); then set -- check --tier ci; fi
exec build/release/tools/kvlab "$@"
