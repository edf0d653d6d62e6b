#!/usr/bin/env bash
# The opt-in long fuzzing run (fuzz/README.md):
#   bash tools/fuzz.sh [seconds-per-target] [target...]
# Builds the fuzz preset, then fuzzes each target (default: all) in turn for the given
# time (default 3600 s) in libFuzzer's fork mode, which keeps going after a crash, a
# timeout or an out-of-memory and saves each one's input. New inputs and those findings
# go outside the source tree:
#   $KVLAB_FUZZ_DIR/corpus/<target>/     the grown corpus (the seeds stay as they are)
#   $KVLAB_FUZZ_DIR/artifacts/<target>/  crash-*, timeout-*, oom-* inputs
# KVLAB_FUZZ_DIR defaults to build/fuzz/long; KVLAB_FUZZ_JOBS (default 1) sets how many
# fuzzing processes each target runs at once.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-3600}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(problem_line case_file run_reference state_file)
dir=${KVLAB_FUZZ_DIR:-build/fuzz/long}
jobs=${KVLAB_FUZZ_JOBS:-1}
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
for t in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$t" "$dir/artifacts/$t"
  echo "== fuzz_$t for $seconds s (corpus $dir/corpus/$t)"
  # The same limits as the fuzz label's runs (fuzz/CMakeLists.txt KVLAB_FUZZ_OPTIONS).
  build/fuzz/fuzz/fuzz_"$t" -max_total_time="$seconds" -fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 \
    -ignore_ooms=1 -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 \
    -dict="fuzz/dict/$t.dict" -artifact_prefix="$dir/artifacts/$t/" "$dir/corpus/$t" "fuzz/corpus/$t" \
    2>&1 | tee "$dir/$t.log" | grep -E '^#[0-9]+: cov|^INFO: (fuzzed|exiting)|^Done' || true
  found=$(find "$dir/artifacts/$t" -type f | wc -l)
  echo "== fuzz_$t: $found input(s) in $dir/artifacts/$t"
done
