#!/usr/bin/env python3
"""Goldens against each other, as one table (golden/README.md).

  golden_table.py replay --kvlab BIN --golden-dir DIR --replays DIR [--known FILE] [--json OUT]
      Diffs every checked-in kvlab golden (DIR/data/<model>.<scenario>.kvlab.safetensors)
      with the engine's replay of the same scenario (REPLAYS/<model>.<scenario>.mlx-lm...)
      through `kvlab golden diff --json` (a scenario the adapter marks
      REPLAYS/<model>.<scenario>.<engine>.not-replayed is a row "not replayed" with the
      marker's reason, and no finding), and judges each failing diff against the register
      of known divergences (the format of harness/known_divergences.h; the op is `golden`,
      filtered by model=, scenario= and raise~=REGEX on the diff's reasons and first
      divergence). An unlisted failure or a stale entry fails the run (exit 1).
  golden_table.py table SUMMARY.json ...
      Merges summaries (this script's --json, `kvlab golden check --summary-json`) into one
      markdown table: model x scenario x engine/backend, with top-1 agreement, max |dlogit|,
      mean KLD and the first divergence or status (--pivot: a column per engine;
      --not-replayed ENGINE=REASON: a column for an engine kvlab does not replay).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "adapters" / "mlx"))
from kvlab_mlx import known  # noqa: E402  (standard library only: no MLX import)


def num(v):
    return float(v) if not isinstance(v, str) else float(v.replace("inf", "Infinity")) if v != "nan" else float("nan")


def summary_row(model, scenario, engine, report):
    s = report["summary"]
    first = report.get("first_divergence")
    statuses = sorted({q["status_b"] for q in report["sequences"] if q["status_b"] != "ok"})
    return {
        "model": model, "scenario": scenario, "engine": engine, "verdict": report["verdict"],
        "top1": s["top1_agreement"], "max_dlogit": num(s["max_abs_dlogit"]), "kld_mean": num(s["kld"]["mean"]),
        "first": None if first is None else
        f"seq {first['sequence']} step {first['step']}" + ("" if first["layer"] is None else f" layer {first['layer']}")
        + f": {first['what']}",
        "statuses": statuses, "reasons": report["reasons"],
    }


def replay(args):
    golden_dir = pathlib.Path(args.golden_dir)
    entries = known.read(args.known) if args.known else []
    rows, findings = [], []
    for scen_file in sorted((golden_dir / "scenarios").iterdir()):
        model = scen_file.name
        for line in scen_file.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            scenario = line.split()[0]
            mine = golden_dir / "data" / f"{model}.{scenario}.kvlab.safetensors"
            theirs = pathlib.Path(args.replays) / f"{model}.{scenario}.{args.engine}.safetensors"
            skipped = theirs.with_name(f"{model}.{scenario}.{args.engine}.not-replayed")
            if skipped.exists():  # the adapter's marker: this engine does not drive the scenario
                reason = skipped.read_text().strip()
                if theirs.exists():
                    findings.append((f"golden model={model} scenario={scenario}",
                                     f"both a replay and a not-replayed marker ({skipped})"))
                rows.append({"model": model, "scenario": scenario, "engine": args.engine, "verdict": "not replayed",
                             "top1": None, "max_dlogit": None, "kld_mean": None, "first": None,
                             "statuses": [reason], "reasons": []})
                continue
            if not theirs.exists():
                rows.append({"model": model, "scenario": scenario, "engine": args.engine, "verdict": "missing",
                             "top1": None, "max_dlogit": None, "kld_mean": None, "first": None,
                             "statuses": [f"no replay {theirs}"], "reasons": []})
                findings.append((f"golden model={model} scenario={scenario}", f"no replay file {theirs}"))
                continue
            out = subprocess.run([args.kvlab, "golden", "diff", str(mine), str(theirs), "--json"], capture_output=True,
                                 text=True)
            if out.returncode not in (0, 1):
                raise SystemExit(f"kvlab golden diff {mine} {theirs} failed ({out.returncode}): {out.stderr}")
            report = json.loads(out.stdout)
            row = summary_row(model, scenario, args.engine, report)
            rows.append(row)
            if report["verdict"] != "pass":
                findings.append((f"golden model={model} scenario={scenario}",
                                 " | ".join(report["reasons"] + ([row["first"]] if row["first"] else []))))
    lines, ok = known.judge(entries, findings)
    print(markdown(rows))
    for line in lines:
        print(line)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def markdown(rows):
    out = ["| model | scenario | engine | verdict | top-1 | max abs dlogit | mean KLD | first divergence / status |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top1 = "-" if r["top1"] is None else f"{100 * r['top1']:.1f}%"
        note = "; ".join(([r["first"]] if r["first"] else []) + r["statuses"]) or "-"
        out.append(f"| {r['model']} | {r['scenario']} | {r['engine']} | {r['verdict']} | {top1} | "
                   f"{fmt(r['max_dlogit'], '.2g')} | {fmt(r['kld_mean'], '.2g')} | {note} |")
    return "\n".join(out)


def pivot(rows):
    """One row per model x scenario, one column per engine: top-1 / max |dlogit| / mean KLD."""
    engines = sorted({r["engine"] for r in rows})
    cells = {(r["model"], r["scenario"], r["engine"]): r for r in rows}
    keys = sorted({(r["model"], r["scenario"]) for r in rows})
    out = ["| model | scenario | " + " | ".join(engines) + " |", "|---|---|" + "---|" * len(engines)]
    for model, scenario in keys:
        line = f"| {model} | {scenario} |"
        for e in engines:
            r = cells.get((model, scenario, e))
            if r is None:
                line += " - |"
                continue
            if r["top1"] is None:  # not replayed, or no replay file: the status says which
                line += f" {r['verdict']}: {'; '.join(r['statuses'])} |"
                continue
            cell = f" {100 * r['top1']:.0f}% / {r['max_dlogit']:.1g} / {r['kld_mean']:.1g}"
            if r["verdict"] != "pass":
                cell += " **" + ("; ".join(r["statuses"]) or r["first"] or "fail") + "**"
            line += cell + " |"
        out.append(line)
    return "\n".join(out)


def table(args):
    rows = []
    for f in args.summaries:
        rows.extend(json.loads(pathlib.Path(f).read_text()))
    # An engine kvlab does not replay gets its column anyway, every cell saying so.
    for spec in args.not_replayed or []:
        engine, _, reason = spec.partition("=")
        for model, scenario in sorted({(r["model"], r["scenario"]) for r in rows}):
            rows.append({"model": model, "scenario": scenario, "engine": engine, "verdict": "not replayed",
                         "top1": None, "max_dlogit": None, "kld_mean": None, "first": None,
                         "statuses": [reason or "no adapter"], "reasons": []})
    rows.sort(key=lambda r: (r["model"], r["scenario"], r["engine"]))
    print(pivot(rows) if args.pivot else markdown(rows))
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replay")
    r.add_argument("--kvlab", required=True)
    r.add_argument("--golden-dir", default=str(ROOT / "golden"))
    r.add_argument("--replays", required=True)
    r.add_argument("--engine", default="mlx-lm")
    r.add_argument("--known")
    r.add_argument("--json")
    t = sub.add_parser("table")
    t.add_argument("summaries", nargs="+")
    t.add_argument("--pivot", action="store_true", help="one row per model x scenario, a column per engine")
    t.add_argument("--not-replayed", action="append", metavar="ENGINE=REASON",
                   help="a column for an engine without a replay, each cell 'not replayed: REASON'")
    args = p.parse_args(argv)
    return replay(args) if args.cmd == "replay" else table(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
