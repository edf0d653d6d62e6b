#!/usr/bin/env bash
# CTest install.downstream (label install): installs a built kvlab into a scratch prefix,
# builds and runs examples/downstream against it (find_package(kvlab), every installed
# header compiled once), then moves the prefix elsewhere and runs the installed kvlab
# CLI from an unrelated directory: it must read the case files and the golden folder
# installed beside it, and generate its model folders in the per-user cache, not the prefix.
#   test_install.sh <build dir> <source dir> <scratch dir> <c++ compiler> <generator> [cmake] [launcher]
set -euo pipefail
build=$1 src=$2 work=$3 cxx=$4 gen=$5 cmake=${6:-cmake} launcher=${7:-}
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
unset KVLAB_CASES_DIR KVLAB_GOLDEN_DIR KVLAB_GOLDEN_MODELS_DIR

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
echo "== installed files per folder"
(cd "$prefix" && find . -type f | sed 's|^\./||; s|/[^/]*$||' | sort | uniq -c)
for f in lib/cmake/kvlab/kvlabConfig.cmake lib/cmake/kvlab/kvlabConfigVersion.cmake lib/cmake/kvlab/kvlabTargets.cmake \
         include/kvlab/backend.h include/harness/check.h include/harness/forwarding_backend.h bin/kvlab \
         share/kvlab/cases/rope/smoke share/kvlab/golden/models/llama_dense/config.json \
         share/kvlab/golden/models/llama_dense/model.sha256 share/kvlab/golden/scenarios/llama_dense \
         share/kvlab/golden/data/llama_dense.plain.kvlab.safetensors share/kvlab/golden/known/mlx; do
  [[ -e $prefix/$f ]] || { echo "missing: $prefix/$f"; exit 1; }
done

echo "== examples/downstream against $prefix"
extra=()
[[ -n $launcher ]] && extra+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
"$cmake" -S "$src/examples/downstream" -B "$work/downstream" -G "$gen" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DKVLAB_CHECK_HEADERS=ON "${extra[@]}" > "$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
grep 'kvlab_downstream:' "$work/configure.log"
"$cmake" --build "$work/downstream" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/downstream/downstream"

echo "== the installed CLI, relocated, from elsewhere"
moved=$work/moved/kvlab
mkdir -p "$work/moved" "$work/elsewhere"
mv "$prefix" "$moved"
cd "$work/elsewhere"
"$moved/bin/kvlab" list > list.txt
grep -F "case files in $moved/share/kvlab/cases" list.txt \
  || { echo "the installed kvlab does not read its own case files:"; tail -3 list.txt; exit 1; }
"$moved/bin/kvlab" check --tier smoke --op rope
# A plugin built against the install tree, judged by the relocated CLI: every op's smoke
# tier through the 13 slots of the ABI.
"$moved/bin/kvlab" check --tier smoke --backend "plugin:$work/downstream/libdownstream_plugin.so"
# The goldens: the installed folder by default (shown in --help), model folders generated
# under $XDG_CACHE_HOME, the checked-in goldens re-run from the installed data.
export XDG_CACHE_HOME=$work/cache
"$moved/bin/kvlab" golden check --help | grep -F "$moved/share/kvlab/golden" \
  || { echo "golden check --help does not default to the installed golden folder"; exit 1; }
"$moved/bin/kvlab" golden models > golden_models.txt
cat golden_models.txt
grep -F "llama_dense: $XDG_CACHE_HOME/kvlab/golden-models/llama_dense sha256" golden_models.txt \
  || { echo "the installed kvlab does not generate its models in the per-user cache"; exit 1; }
if find "$moved" -name model.safetensors | grep -q .; then
  echo "the installed kvlab wrote model weights into its prefix:"; find "$moved" -name model.safetensors; exit 1
fi
"$moved/bin/kvlab" golden check --model llama_dense --scenario plain,prefix
if [[ -x $moved/bin/kvlab_bench ]]; then
  "$moved/bin/kvlab_bench" --kvlab_tier=smoke --benchmark_list_tests=true | tail -1
fi
echo "install test: ok"
