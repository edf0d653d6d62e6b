"""Run every repro of an engine's registers against the pinned wheels (CTests
conformance.repros_mlx_vlm, conformance.repros_vllm_mlx): each is a standalone script
(adapters/mlx/repros/<engine>/<ID>_*.py, ID the entry's V#/X#) a maintainer can paste, which
asserts that its divergence is still there. An engine's registers are ENGINE-caches and
every ENGINE-*-caches (one per prefix store of vllm-mlx), each with its .adapter. A repro that stops reproducing (an
AssertionError) or breaks (any other error) fails the run; so does an entry of the
registers (harness/known/ENGINE-caches, .adapter, and ENGINE-turboquant[-batch] and
golden/known/ENGINE where they exist)
with no repro, or a repro no entry names.

    python adapters/mlx/repros/run.py mlx-vlm            (build/venv)
    python adapters/mlx/repros/run.py vllm-mlx           (build/venv-vllm-mlx)

mlx_vlm's (and mlx-lm 0.31.3's) package __init__ imports transformers and more, which the
pinned venvs do not hold: kvlab_mlx.engines loads the cache subpackages under stub
parents first, as the replay does; the repros import the modules as a user would.
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
    # the registers of the engine's other prefix stores share its repros (vllm-mlx-kvq,
    # vllm-mlx-manager: kvlab_mlx/engines.py VLLM_MLX_STORES)
    registers += sorted((ROOT / "harness" / "known").glob(f"{engine}-*-caches")) + \
        sorted((ROOT / "harness" / "known").glob(f"{engine}-*-caches.adapter"))
    # an engine's codec register too, where it has one (mlx-vlm's TurboQuant: V12, V13)
    # and its batch TurboQuant register (mlx-vlm's BatchTurboQuantKVCache: T1)
    for name in (f"{engine}-turboquant", f"{engine}-turboquant-batch"):
        codec_register = ROOT / "harness" / "known" / name
        if codec_register.is_file():
            registers.append(codec_register)
    # and its golden register (golden/known/<engine>: mlx-vlm's V14-V16)
    golden_register = ROOT / "golden" / "known" / engine
    if golden_register.is_file():
        registers.append(golden_register)
    from kvlab_mlx import engines

    engines.load(engine)
    named = {m for r in registers for m in re.findall(r"\(([A-Z][0-9]+)\)\s*$", r.read_text(), re.M)}
    files = sorted((p for p in folder.glob("*.py") if re.match(r"[A-Z][0-9]+_", p.name)),
                   key=lambda p: int(re.match(r"[A-Z]([0-9]+)", p.name).group(1)))
    have = {re.match(r"([A-Z][0-9]+)_", p.name).group(1) for p in files}
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
    print(f"{len(files)} repros run against the pinned {engine}; {failed} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
