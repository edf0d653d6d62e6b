#!/usr/bin/env bash
# Packs build/ci's kvlab and kvlab_bench, built on Debian 12, with the shared libraries a
# bare GPU machine lacks (the Vulkan loader, the validation layer, libglvnd for NVIDIA's
# ICD, libhwy, libbenchmark, the pinned MLX wheel's libraries) into .dev/pack.tar.xz
# (~14 MB), for bench/device/run.sh there. Run from the repository root after
# `cmake --build build/ci --target kvlab kvlab_bench`; .dev/ is for .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .dev
rm -rf /tmp/devpack && mkdir -p /tmp/devpack/lib /tmp/devpack/layers
cp build/ci/tools/kvlab build/ci/bench/kvlab_bench /tmp/devpack/
for f in $(ldd build/ci/tools/kvlab build/ci/bench/kvlab_bench | awk '/=>/{print $3}' | sort -u); do
  case $f in */libc.so*|*/libm.so*) ;; *) cp -L $f /tmp/devpack/lib/;; esac
done
cp -L /usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so /tmp/devpack/lib/
# The NVIDIA ICD (libGLX_nvidia) needs libglvnd, which the device lacks.
for l in libGLdispatch.so.0 libGLX.so.0 libEGL.so.1 libOpenGL.so.0 libGL.so.1 libGLESv2.so.2; do cp -L /usr/lib/x86_64-linux-gnu/$l /tmp/devpack/lib/; done
cp /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json /tmp/devpack/layers/
tar -C /tmp/devpack -cf - . | xz -T2 -6 > .dev/pack.tar.xz
ls -la .dev/pack.tar.xz
