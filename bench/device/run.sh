#!/usr/bin/env bash
# On a GPU machine, in the repository root with .dev/pack.tar.xz (bench/device/pack.sh):
# the Vulkan backend's ci tier with the validation layer (PASS_BACKEND, a variant such as
# vulkan:,validate,general, is checked on quantized_sdpa first), then kvlab_bench over
# CASES and BACKENDS, and
# tools/bench_table.py's table and per-pass times. Output under $OUT. T1..T3 bound the three steps (s);
# a probe first fails fast, with the loader's log, where no driver loads.
set -uo pipefail
OUT=${OUT:-/tmp/devout}; mkdir -p $OUT
D=/tmp/kvdev; mkdir -p $D && tar -C $D -xJf .dev/pack.tar.xz
export LD_LIBRARY_PATH=$D/lib:/usr/local/nvidia/lib64:/usr/lib VK_LAYER_PATH=$D/layers KVLAB_CASES_DIR=$PWD/harness/cases
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
for j in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  [ -f $j ] && { export VK_DRIVER_FILES=$j; break; }
done
echo "ICD: ${VK_DRIVER_FILES:-none}"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tail -1
K=$D/kvlab; B=$D/kvlab_bench
if ! $K check --backend vulkan: --tier smoke --op rope --progress never > $OUT/probe.txt 2>&1; then
  cat $OUT/probe.txt; VK_LOADER_DEBUG=error,driver $K check --backend vulkan: --tier smoke --op rope 2>&1 | tail -12; exit 1
fi
tail -1 $OUT/probe.txt
if [ -n "${PASS_BACKEND:-}" ]; then
  timeout ${T1:-150} $K check --backend $PASS_BACKEND --tier ci --op quantized_sdpa --progress never 2>&1 | tail -4 | tee $OUT/check_pass.txt
fi
timeout ${T2:-120} $K check --backend vulkan:,validate --tier ci --progress never 2>&1 | tail -18 | tee $OUT/check_default.txt
# The driver's statistics of each pipeline built (registers, local memory) go to pipelines.txt.
KVLAB_VK_PIPELINE_STATS=1 timeout ${T3:-300} $B --kvlab_cases=${CASES:-harness/cases/quantized_sdpa/perf_gpu} \
  --kvlab_backends=${BACKENDS:-vulkan,vulkan:,general} --benchmark_repetitions=${REPS:-3} \
  --benchmark_out=$OUT/bench.json --benchmark_out_format=json > $OUT/bench.log 2>&1
grep '^kvlab vulkan pipeline' $OUT/bench.log | sort -u > $OUT/pipelines.txt
grep -v '^kvlab vulkan pipeline' $OUT/bench.log | tail -40
python3 tools/bench_table.py table $OUT/bench.json 2>&1 | tail -30 | tee $OUT/table.txt
python3 tools/bench_table.py passes $OUT/bench.json 2>&1 | tail -40 | tee $OUT/passes.txt
