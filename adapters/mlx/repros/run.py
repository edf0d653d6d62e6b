"""Run every repro of an engine's register against the pinned wheel (CTest
conformance.repros_mlx_vlm): each is a standalone script a maintainer can paste, which
asserts that its divergence is still there. A repro that stops reproducing (an
AssertionError) or breaks (any other error) fails the run; so does an entry of the
registers with no repro, or a repro no entry names.

    python adapters/mlx/repros/run.py mlx-vlm

mlx_vlm's package __init__ imports transformers, opencv and more, which the pinned venv
does not hold: kvlab_mlx.engines loads the cache subpackages under stub parents first, as
the replay does; the repros themselves import mlx_vlm.models.cache as a user would.
"""

from __future__ import annotations

import pathlib
import re
import runpy
import sys
import traceback

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path.insert(0, str(HERE.parent))


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    engine = argv[0]
    folder = HERE / engine.replace("-", "_")
    registers = [ROOT / "harness" / "known" / f"{engine}-caches", ROOT / "harness" / "known" / f"{engine}-caches.adapter"]
    if not folder.is_dir() or not all(r.is_file() for r in registers):
        print(f"repros: no repros or registers for engine {engine!r}", file=sys.stderr)
        return 2
    from kvlab_mlx import engines

    engines.load(engine)
    named = {m for r in registers for m in re.findall(r"\((V[0-9]+)\)\s*$", r.read_text(), re.M)}
    files = sorted(folder.glob("V*.py"), key=lambda p: int(re.match(r"V([0-9]+)", p.name).group(1)))
    have = {re.match(r"(V[0-9]+)_", p.name).group(1) for p in files}
    failed = 0
    for p in files:
        try:
            runpy.run_path(str(p), run_name="__main__")
            print(f"REPRODUCED {p.name}")
        except Exception:
            failed += 1
            print(f"FAILED {p.name}:\n{traceback.format_exc()}")
    for missing in sorted(named - have):
        failed += 1
        print(f"FAILED {missing}: a register entry without a repro ({folder.relative_to(ROOT)}/{missing}_*.py)")
    for stray in sorted(have - named):
        failed += 1
        print(f"FAILED {stray}: a repro no register entry names")
    print(f"{len(files) - failed if failed <= len(files) else 0} of {len(files)} repros reproduce against the pinned "
          f"{engine}; {failed} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
