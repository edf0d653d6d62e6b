#!/usr/bin/env python3
"""Fails when a kvlab function is defined both strongly and inline in different objects
of a static library (nm: T in one object, W in another).

The linker then keeps the strong definition for every caller without a word. That is
how affine_quantize.cc's own HalfRowToF32 (whole vectors only) replaced the shared
inline one (any length) in the quantized-decode combine, which then read past short
rows: seen only by ASan, in CI. Highway kernels live in per-target namespaces
(kvlab::simd::N_AVX3, ...), so a helper name reused across kernel files collides.

usage: check_odr_symbols.py LIBRARY.a [nm]
"""
import collections
import subprocess
import sys


def definitions(library, nm):
    out = subprocess.run([nm, "-C", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    kinds = collections.defaultdict(lambda: collections.defaultdict(set))  # symbol -> kind -> objects
    obj = "?"
    for line in out.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            obj = line[:-1]
            continue
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("T", "W") and parts[2].startswith("kvlab::"):
            kinds[parts[2]][parts[1]].add(obj)
    return kinds


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    nm = sys.argv[2] if len(sys.argv) == 3 else "nm"
    clashes = [(sym, k) for sym, k in definitions(sys.argv[1], nm).items() if "T" in k and "W" in k]
    for sym, k in sorted(clashes):
        print(f"ODR clash: {sym} is defined strongly in {sorted(k['T'])} and inline in {sorted(k['W'])}")
    if not clashes:
        print(f"no strong/inline clash among the kvlab symbols of {sys.argv[1]}")
    return 1 if clashes else 0


if __name__ == "__main__":
    sys.exit(main())
