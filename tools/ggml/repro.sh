#!/usr/bin/env bash
# The standalone C repros of harness/known/ggml (tools/ggml/repro/g<N>_*.c, one per entry
# G<N>), compiled against the ggml engine of tools/ggml/engine.sh and run; each exits 0
# while its divergence reproduces. Prints one line per repro; fails when one does not.
#   tools/ggml/repro.sh [build/ggml-engine]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
engine=${1:-$root/build/ggml-engine}
[[ -f "$engine/install/lib/libggml-cpu.a" ]] || { echo "SKIPPED: no ggml engine in $engine (tools/ggml/engine.sh)"; exit 0; }
out="$engine/repro"
mkdir -p "$out"
status=0
for src in "$root"/tools/ggml/repro/g*.c; do
  name=$(basename "$src" .c)
  # ggml-cpu has C++ sources: link with the C++ driver.
  if ! ${CC:-cc} -O1 -std=gnu11 -I"$engine/install/include" -c "$src" -o "$out/$name.o" ||
     ! ${CXX:-c++} "$out/$name.o" "$engine/install/lib/libggml-cpu.a" "$engine/install/lib/libggml-base.a" \
       -lm -lpthread -o "$out/$name"; then
    echo "$name: does not build"; status=1; continue
  fi
  if "$out/$name" >"$out/$name.txt" 2>&1; then
    echo "$name: $(tail -1 "$out/$name.txt")"
  else
    echo "$name: $(tail -1 "$out/$name.txt")"; status=1
  fi
done
exit $status
