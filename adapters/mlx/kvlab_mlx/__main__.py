"""python -m kvlab_mlx run IN -o OUT [--ops a,b] | info FILE | prompt-cache --kvlab KVLAB --work DIR
                  | golden --model DIR --scenarios FILE --out OUTDIR [--scenario NAME --teacher GOLDEN]
                  | golden-vlm --model DIR --scenarios FILE --out OUTDIR
                  | golden-vllm --model DIR --scenarios FILE --out OUTDIR [--golden-dir DIR [--concurrent-out DIR --kvlab BIN]]"""

from __future__ import annotations

import argparse
import sys

from . import vectors


def _cmd_run(args):
    from .run import recompute  # imports MLX; `info` works without it

    from . import cache_replay

    cache_replay.use_engine(args.cache_engine)
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
    status = 0
    if args.known_findings:  # every raise listed, every entry still raised (kvlab_mlx/known.py)
        from . import known

        entries = known.read(args.known_findings)
        lines, ok = known.judge(entries, report.raised)
        print(f"findings against {args.known_findings}:")
        for line in lines:
            print(line)
        status = 0 if ok else 1
    elif report.raised and not args.report_json:
        status = 1  # unexplained; with --report-json they are judged later (`findings`)
    if args.report_json:  # per problem: computed, skipped (why), finding (which entry)
        import json

        listed = {line: (e.where, e.klass) for e in (entries if args.known_findings else []) for line in e.hits}
        rows = [{"line": line, "outcome": "computed"} for line in report.computed_lines]
        rows += [{"line": line, "outcome": "skipped", "reason": why} for line, why in report.skipped_lines]
        rows += [{"line": line, "outcome": "finding", "message": msg, "entry": listed.get(line, (None, None))[0],
                  "class": listed.get(line, (None, "unlisted"))[1]} for line, msg in report.raised]
        with open(args.report_json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=0)
    # Skips are MLX's limits and expected; a failure is an error somebody must look at.
    return 1 if report.failed else status


def _cmd_scripts(args):
    from . import scripts

    known = sorted({*scripts.ENGINE_KINDS, *scripts.PREFIX_ENGINES})
    if args.engine not in known:
        raise ValueError(f"unknown engine {args.engine!r} (known: {', '.join(known)})")
    if args.engine in scripts.PREFIX_ENGINES:  # its own code is a prefix store: prefix scripts
        kinds = [k for part in args.kinds for k in part.split(",") if k] if args.kinds else scripts.PREFIX_KINDS
        text = "\n".join(scripts.prefix_lines(args.count, args.seed, kinds, args.engine)) + "\n"
    else:
        kinds = [k for part in args.kinds for k in part.split(",") if k] if args.kinds else scripts.ENGINE_KINDS[args.engine]
        text = "\n".join(scripts.lines(args.count, args.seed, kinds)) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(f"# python -m kvlab_mlx scripts --count {args.count} --seed {args.seed} --engine {args.engine}\n" + text)
    return 0


def _cmd_findings(args):
    """Judge the findings of several `run --report-json` files against one register."""
    import json

    from . import known

    raised = []
    for path in args.reports:
        with open(path, encoding="utf-8") as f:
            raised += [(r["line"], r["message"]) for r in json.load(f) if r["outcome"] == "finding"]
    entries = known.read(args.known_findings)
    lines, ok = known.judge(entries, raised)
    print(f"{len(raised)} findings against {args.known_findings}:")
    for line in lines:
        print(line)
    listed = {line: (e.where, e.klass) for e in entries for line in e.hits}
    for path in args.reports:  # the classes go back into the reports, for the table
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)
        for r in rows:
            if r["outcome"] == "finding":
                r["entry"], r["class"] = listed.get(r["line"], (None, "unlisted"))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=0)
    return 0 if ok else 1


def _cmd_prefix_rule(args):
    """The replay's shadow of kvlab's prefix rule against the oracle's offsets."""
    from . import prefix_stores, vectors

    problems = []
    for path in args.vectors:
        for vp in vectors.read(path).problems:
            if " script=" in vp.line and any(w[:1] in "wig" for w in vp.line.split("script=")[1].split()[0].split(".")):
                problems.append((vp.line, [int(x) for x in vp.outputs["offsets"].array.reshape(-1)]))
    bad = prefix_stores.check_against_oracle(problems)
    for line in bad[:20]:
        print("DISAGREES", line)
    print(f"prefix rule: {len(problems)} prefix scripts, {len(bad)} disagree with kvlab's PrefixCache")
    return 1 if bad else 0


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


def _cmd_golden(args):
    from .golden_replay import main as golden  # imports MLX and mlx-lm

    return golden(args.model, args.scenarios, args.scenario, args.out, args.model_id, args.teacher)


def _cmd_golden_vlm(args):
    from .golden_replay_vlm import main as golden  # imports MLX and mlx-vlm

    return golden(args.model, args.scenarios, args.out, args.model_id)


def _cmd_golden_vllm(args):
    from .golden_replay_vllm import main as golden  # imports MLX, mlx-lm 0.31.3 and vllm-mlx

    return golden(args.model, args.scenarios, args.out, args.model_id, args.golden_dir, args.concurrent_out, args.kvlab)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvlab_mlx",
                                 description="Recompute kvlab vectors files with real MLX / mlx-lm.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="recompute every problem of IN with MLX and write OUT")
    r.add_argument("input", metavar="IN")
    r.add_argument("-o", "--output", required=True, metavar="OUT")
    r.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (space or comma separated)")
    r.add_argument("--report-json", metavar="FILE", help="write every problem's outcome as JSON")
    r.add_argument("--known-findings", metavar="FILE",
                   help="register of findings the adapter judges itself: the engine raised, or a cache's "
                        "content differs in length (harness/known format, kvlab_mlx/known.py); an "
                        "unlisted finding or a stale entry fails the run")
    r.add_argument("--cache-engine", default="mlx-lm", metavar="NAME",
                   help="whose cache classes replay the cache problems: mlx-lm (default) or mlx-vlm "
                        "(kvlab_mlx/engines.py)")
    r.set_defaults(fn=_cmd_run)
    g = sub.add_parser("scripts", help="write seeded random cache problems (a kvlab case file)")
    g.add_argument("--count", type=int, default=300, help="problems per kind")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--kinds", nargs="+", metavar="KIND", help="cache kinds (default: every kind the engine has)")
    g.add_argument("--engine", default="mlx-lm", metavar="NAME", help="whose kinds: mlx-lm (default), mlx-vlm, or a vllm-mlx store (prefix scripts: vllm-mlx, vllm-mlx-kvq, vllm-mlx-manager)")
    g.add_argument("-o", "--output", default="-", metavar="FILE")
    g.set_defaults(fn=_cmd_scripts)
    j = sub.add_parser("findings", help="judge the findings of run --report-json files against a register")
    j.add_argument("reports", nargs="+", metavar="REPORT_JSON")
    j.add_argument("--known-findings", required=True, metavar="FILE")
    j.set_defaults(fn=_cmd_findings)
    pr = sub.add_parser("prefix-rule", help="check the prefix replay's shadow of kvlab's matching rule "
                        "against the oracle's offsets in kvlab vectors files")
    pr.add_argument("vectors", nargs="+")
    pr.set_defaults(fn=_cmd_prefix_rule)
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
    gr = sub.add_parser("golden", help="replay golden scenarios with mlx-lm's own generation and write goldens")
    gr.add_argument("--model", required=True, metavar="DIR", help="model directory (config.json, model.safetensors)")
    gr.add_argument("--scenarios", required=True, metavar="FILE", help="scenario file (golden/scenarios/<model id>)")
    gr.add_argument("--scenario", nargs="+", metavar="NAME", help="only these scenarios")
    gr.add_argument("--out", required=True, metavar="OUTDIR",
                    help="writes OUTDIR/<model id>.<scenario>.mlx-lm.safetensors")
    gr.add_argument("--model-id", metavar="ID", help="model id (default: the scenario file's name)")
    gr.add_argument("--teacher", metavar="GOLDEN",
                    help="feed this golden's tokens as inputs (teacher forcing, as kvlab golden record --teacher): "
                         "each step's logits compare with the teacher's over the whole stream; one --scenario, "
                         "not a batch")
    gr.set_defaults(fn=_cmd_golden)
    def engine_golden_parser(name, engine, help_text, written):
        """The arguments every engine's golden replay shares."""
        g = sub.add_parser(name, help=help_text)
        g.add_argument("--model", required=True, metavar="DIR", help="model directory (config.json, model.safetensors)")
        g.add_argument("--scenarios", required=True, metavar="FILE", help="scenario file (golden/scenarios/<model id>)")
        g.add_argument("--out", required=True, metavar="OUTDIR",
                       help=f"writes OUTDIR/<model id>.<scenario>.{engine}.safetensors{written}")
        g.add_argument("--model-id", metavar="ID", help="model id (default: the scenario file's name)")
        return g

    gv = engine_golden_parser("golden-vlm", "mlx-vlm", "replay golden scenarios with mlx-vlm's own language models, "
                              "caches and generate_step, and write goldens", "")
    gv.set_defaults(fn=_cmd_golden_vlm)
    gl = engine_golden_parser("golden-vllm", "vllm-mlx", "replay golden scenarios through vllm-mlx's "
                              "continuous-batching scheduler (its venv: build/venv-vllm-mlx), and write goldens",
                              " (or .not-replayed)")
    gl.add_argument("--golden-dir", metavar="DIR",
                    help="kvlab's goldens (golden/data): check each request's reused prefix length against "
                         "its golden's (kvlab golden diff does not compare it); exit 1 on a difference")
    gl.add_argument("--concurrent-out", metavar="DIR",
                    help="also run four concurrent requests of the plain prompt under each global kv-cache "
                         "quantization setting (SwiftLM's Test 9 as far as vllm-mlx reaches: it takes no "
                         "per-request kv_bits) and judge each row against kvlab's plain golden (needs "
                         "--golden-dir and --kvlab)")
    gl.add_argument("--kvlab", metavar="BIN", help="the kvlab executable (for --concurrent-out)")
    gl.set_defaults(fn=_cmd_golden_vllm)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, OSError) as e:
        print(f"kvlab_mlx: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
