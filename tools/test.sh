#!/usr/bin/env bash
# The test command: installs dependencies, then builds and tests two configurations.
#   ci   — Release with assertions, warnings as errors, every label.
#   asan — ASan + UBSan, the unit and property labels.
# JUnit reports land in build/<preset>/junit.xml.
set -euo pipefail
cd "$(dirname "$0")/.."
# Let ccache reuse objects across clones in different directories.
export CCACHE_BASEDIR="$PWD"
bash tools/setup.sh

run_config() {
  local preset=$1 labels=$2 start=$SECONDS
  echo "== [$preset] configure + build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  echo "== [$preset] ctest ${labels:+-L $labels}"
  ctest --preset "$preset" ${labels:+-L "$labels"} --output-junit junit.xml
  echo "== [$preset] passed in $((SECONDS - start)) s"
}

run_config ci ""
run_config asan "unit|property"
echo "== all configurations passed in ${SECONDS} s"
