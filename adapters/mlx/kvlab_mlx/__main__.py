"""python -m kvlab_mlx run IN -o OUT [--ops a,b] | info FILE | prompt-cache --kvlab KVLAB --work DIR"""

from __future__ import annotations

import argparse
import sys

from . import vectors


def _cmd_run(args):
    from .run import recompute  # imports MLX; `info` works without it

    src = vectors.read(args.input)
    only = {o for part in args.ops for o in part.split(",") if o} if args.ops else None
    out, report = recompute(src, only)
    vectors.write(args.output, out)
    print(f"{args.input}: {len(src.problems)} problems ({src.metadata.get('engine')} "
          f"{src.metadata.get('engine_version')}, {src.metadata.get('flavour')})")
    for line in report.lines():
        print(line)
    print(f"wrote {args.output}: {len(out.problems)} problems, engine=mlx {out.metadata['engine_version']}, "
          f"flavour={out.metadata['flavour']}")
    # Skips are MLX's limits and expected; a failure is an error somebody must look at.
    return 1 if report.failed else 0


def _cmd_info(args):
    v = vectors.read(args.file)
    for k, val in sorted(v.metadata.items()):
        if not k.startswith("problem."):
            print(f"{k}: {val}")
    for k, p in enumerate(v.problems):
        print(f"[{k}] {p.line}")
        if args.tensors:
            for side, ts in (("in", p.inputs), ("out", p.outputs)):
                for name, t in ts.items():
                    print(f"     {side}.{name}: {t.dtype}{list(t.array.shape)}")
    return 0


def _cmd_prompt_cache(args):
    from .prompt_cache import main as prompt_cache  # imports MLX and mlx-lm

    return prompt_cache(args.kvlab, args.work, args.case, args.seed)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvlab_mlx",
                                 description="Recompute kvlab vectors files with real MLX / mlx-lm.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="recompute every problem of IN with MLX and write OUT")
    r.add_argument("input", metavar="IN")
    r.add_argument("-o", "--output", required=True, metavar="OUT")
    r.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (space or comma separated)")
    r.set_defaults(fn=_cmd_run)
    i = sub.add_parser("info", help="print a vectors file's metadata and problems")
    i.add_argument("file", metavar="FILE")
    i.add_argument("-t", "--tensors", action="store_true", help="also list each problem's tensors")
    i.set_defaults(fn=_cmd_info)
    p = sub.add_parser("prompt-cache", help="prompt-cache files both ways between mlx-lm and kvlab, bit for bit")
    p.add_argument("--kvlab", required=True, help="the kvlab executable")
    p.add_argument("--work", required=True, metavar="DIR", help="scratch directory for the files")
    p.add_argument("--case", nargs="+", help="only these cases of prompt_cache_cases.json")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_prompt_cache)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, OSError) as e:
        print(f"kvlab_mlx: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
