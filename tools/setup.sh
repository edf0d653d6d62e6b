#!/usr/bin/env bash
# Installs every build and test dependency of kvlab from Debian 12 packages.
# Idempotent and quiet: does nothing (and prints one line) when all are present.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config git ccache
  libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  libxtensor-dev xtl-dev libxsimd-dev libhwy-dev nlohmann-json3-dev libcli11-dev
  libvulkan-dev mesa-vulkan-drivers vulkan-validationlayers
  libshaderc-dev glslc glslang-dev spirv-tools
  clang libclang-rt-14-dev
  python3 python3-venv
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "kvlab setup: all ${#packages[@]} packages present"
else
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "kvlab setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "kvlab setup: done"
fi

# The pinned Python venv of the real-engine replays (never fails: absence is a skip).
bash "$(dirname "$0")/setup_venv.sh"

# The pinned vllm-mlx venv of its prefix-cache replay (never fails either).
bash "$(dirname "$0")/setup_venv_vllm_mlx.sh"

# The pinned gguf-py venv and its vectors for the ggml block oracle (never fails either).
bash "$(dirname "$0")/ggml/setup_venv.sh"

# The ggml engine of the ggml backend: the pinned llama-cpp-python sdist's ggml, built
# static into build/ggml-engine (never fails either: absence is a skip with the reason).
bash "$(dirname "$0")/ggml/engine.sh"

# The pinned universalmutator venv of tools/mutate.sh (never fails: absence is a reason).
bash "$(dirname "$0")/mutate/setup_venv.sh"
