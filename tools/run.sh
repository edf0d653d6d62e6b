#!/usr/bin/env bash
# The main job: installs dependencies, builds the release CLI and runs the harness over
# the default matrix: the ci tier on the SIMD backend (the best Highway target of this
# CPU) and on the Vulkan backend (the lavapipe tier on a CPU driver, else the ci tier;
# without a device every Vulkan case reports UNIMPLEMENTED with the reason).
# With arguments, runs `kvlab <arguments>` instead (e.g. `check --backend simd:AVX2`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Let ccache reuse objects across clones in different directories: paths relative to
# the clone, and (for the -g builds, asan) the working directory left out of the hash.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
bash tools/setup.sh
cmake --preset release >/dev/null
# A first build takes minutes on a small machine: say so, and show its progress (every
# tenth step of ninja's [done/total], and every line that is not progress: warnings and
# errors) instead of staying silent.
echo "kvlab: building the release CLI (build/release; a first build takes several minutes)"
cmake --build --preset release --target kvlab 2>&1 |
  awk '/^\[[0-9]+\/[0-9]+\]/ { s = $1; gsub(/[][]/, "", s); split(s, f, "/"); if (++n % 10 == 1 || f[1] == f[2]) { print "kvlab: build step " f[1] " of " f[2]; fflush() } next } { print; fflush() }'
echo "kvlab: built $PWD/build/release/tools/kvlab"
kvlab=build/release/tools/kvlab
if (($# > 0)); then exec "$kvlab" "$@"; fi

vulkan_tier=ci
if "$kvlab" list 2>/dev/null | grep -q "here: vulkan:llvmpipe"; then vulkan_tier=lavapipe; fi
# Exit status: the worse of the two runs (0 passed, 1 a case failed, 2 a usage or I/O
# error). A machine without a Vulkan device prints the reason and skips that half.
status=0
"$kvlab" check --tier ci --backend simd || status=$?
"$kvlab" check --tier "$vulkan_tier" --backend vulkan --allow-unavailable || { s=$?; ((s > status)) && status=$s; }
exit $status
