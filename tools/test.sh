#!/usr/bin/env bash
# The test command: installs dependencies, then builds and tests three configurations,
# each test compiled once, in the configuration where it earns its keep:
#   ci   — GCC, Release -O2 with assertions, warnings as errors: what needs optimized
#          code or every Highway target — the harness (reference, every SIMD target,
#          Vulkan on lavapipe with the validation layer), the SIMD unit tests,
#          bench-smoke, and the conformance label (real MLX from build/venv judged over
#          the ci tier; skips with the reason when tools/setup_venv.sh could not build
#          the venv).
#   asan — clang, ASan + UBSan (-fno-sanitize-recover): the unit suites (core,
#          reference, caches, SIMD on SCALAR and the host's widest of AVX3/AVX2,
#          Vulkan), the property suite (50 cases per property, at the fixed seed and at
#          one derived from the commit), the bug zoo, and the kvlab CLI (label cli: the
#          smoke tier of every op and backend, the bad-input table), and the libFuzzer
#          targets (label fuzz: a fixed number of runs each, and the regression inputs
#          replayed; the libraries they drive carry edge counters, fuzz/README.md;
#          bash tools/fuzz.sh fuzzes for hours in the fully instrumented fuzz preset).
# So kvlab's code is compiled by GCC (ci) and by clang (asan), -Werror in each.
# The opt-in property-deep label (10x the cases) runs with
#   cmake --preset asan && cmake --build --preset asan && ctest --preset asan -L '^property-deep$'
# and the opt-in conformance-deep label (the mlx-lm cache replay over the full tier and
# 3000 random scripts per kind, and 1000 cell scripts per model and route through
# llama.cpp) with  ctest --preset ci -L '^conformance-deep$'
# ctest -L/-LE take regexes, so labels are anchored: '^property$' must not match
# 'property-deep'.
# JUnit reports land in build/<preset>/junit.xml.
set -euo pipefail
cd "$(dirname "$0")/.."
# Let ccache reuse objects across clones in different directories: paths relative to
# the clone, and (for the -g builds, asan) the working directory left out of the hash.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
bash tools/setup.sh

run_config() {
  local preset=$1 select=$2 start=$SECONDS
  echo "== [$preset] configure + build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  echo "== [$preset] ctest $select"
  # shellcheck disable=SC2086  # $select holds option words
  ctest --preset "$preset" $select --output-junit junit.xml
  echo "== [$preset] passed in $((SECONDS - start)) s"
}

# ci before asan: the ci run's lavapipe checks fill Mesa's shader cache with the
# pipelines the asan Vulkan tests use, which lavapipe would otherwise compile inside ASan
# processes, several times slower (docs/ci.md §Phases).
run_config ci "-LE ^(property-deep|conformance-deep)$"
run_config asan "-L ^(unit|property|zoo|cli|fuzz)$"
# Each fuzz target's executions, from libFuzzer's last line ("Done N runs in S second(s)").
awk '/^[0-9]+\/[0-9]+ Test: /{t=$3} /^Done [0-9]+ runs/{print "== [asan] " t ": " $0}' \
  build/asan/Testing/Temporary/LastTest.log
echo "== all configurations passed in ${SECONDS} s"
