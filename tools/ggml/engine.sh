#!/usr/bin/env bash
# The ggml engine of the ggml backend (kernels/ggml, docs/engines.md §The ggml backend) and
# the llama.cpp library of the llama.cpp replays (adapters/llama): downloads the sdist
# pinned in tools/ggml/engine.lock once (sha256-checked; an already-downloaded file of the
# right hash is kept), unpacks its vendor/llama.cpp (without its models/ and docs/) and
# builds ggml-base, ggml-cpu and llama with CMake (static, GGML_NATIVE, no OpenMP: ggml's
# own threadpool, no tests, tools, examples or app), installed into
# build/ggml-engine/install, where cmake/KvlabGgml.cmake finds them. The vendored gguf-py
# (the GGUF writer of the same commit) stays at build/ggml-engine/src/llama.cpp/gguf-py.
# Idempotent: a stamp of the hash, the build options and the CPU's flags keeps a finished
# build (GGML_NATIVE code is this CPU's). Never fails the caller: without network or a
# toolchain it writes the reason to build/ggml-engine/unavailable, and the ggml backend
# and the llama.cpp replays are absent (their tests skip with it).
#   tools/ggml/engine.sh            # what tools/setup.sh runs
#   KVLAB_GGML_JOBS=2 nice -n19 tools/ggml/engine.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/build/ggml-engine"
lock="$root/tools/ggml/engine.lock"
mkdir -p "$out"
field() { awk -v k="$1" '$1 == k { print $2 }' "$lock"; }
file=$(field file) url=$(field url) sha=$(field sha256)

fail() {
  echo "$1" >"$out/unavailable"
  rm -rf "$out/install"
  echo "kvlab ggml engine: unavailable: $1 (the ggml backend is absent, its tests skip)"
  exit 0
}

options=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=OFF
  -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=ON -DGGML_ALL_WARNINGS=OFF
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_HTML=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_ALL_WARNINGS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
stamp="$sha ${options[*]} $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-16)"
if [[ -f "$out/install/.kvlab-stamp" ]] && [[ "$(cat "$out/install/.kvlab-stamp")" == "$stamp" ]]; then
  echo "kvlab ggml engine: build/ggml-engine/install is up to date"
  exit 0
fi

sdist="$out/$file"
have_sha() { [[ -f "$sdist" ]] && [[ "$(sha256sum "$sdist" | cut -d' ' -f1)" == "$sha" ]]; }
if ! have_sha; then
  rm -f "$sdist"
  # curl, else Python's urllib (a fresh Debian 12 has python3, not always curl).
  if command -v curl >/dev/null; then
    curl -fsSL --retry 2 -o "$sdist.part" "$url" 2>"$out/download.log"
  else
    ${KVLAB_PYTHON:-python3} -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$url" "$sdist.part" 2>"$out/download.log"
  fi || { rm -f "$sdist.part"; fail "could not download $url (see build/ggml-engine/download.log)"; }
  mv "$sdist.part" "$sdist"
  have_sha || { rm -f "$sdist"; fail "$file does not have the pinned sha256 $sha"; }
fi

rm -rf "$out/src" "$out/build" "$out/install"
mkdir -p "$out/src"
tar -xzf "$sdist" -C "$out/src" --strip-components=2 --exclude='*/vendor/llama.cpp/models' \
  --exclude='*/vendor/llama.cpp/docs' "${file%.tar.gz}/vendor/llama.cpp" ||
  fail "could not unpack vendor/llama.cpp from $file"
jobs=${KVLAB_GGML_JOBS:-$(nproc)}
start=$SECONDS
{
  cmake -S "$out/src/llama.cpp" -B "$out/build" -G Ninja "${options[@]}" -DCMAKE_INSTALL_PREFIX="$out/install" &&
    cmake --build "$out/build" -j "$jobs" &&
    cmake --install "$out/build"
} >"$out/build.log" 2>&1 || fail "the ggml/llama.cpp build failed (see build/ggml-engine/build.log)"
printf '%s' "$stamp" >"$out/install/.kvlab-stamp"
rm -f "$out/unavailable"
echo "kvlab ggml engine: built in $((SECONDS - start)) s into build/ggml-engine/install"
