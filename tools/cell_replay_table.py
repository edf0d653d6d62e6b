#!/usr/bin/env python3
"""The cell-script replay's table (docs/engines.md §llama.cpp): per model and route, how
many cell scripts ran through kvlab's oracle and llama.cpp and how each ended, every
divergence judged by the register.

  tools/cell_replay_table.py RESULTS.jsonl... --known harness/known/llama.cpp-cells.adapter
                             [--markdown OUT.md]

RESULTS: `kvlab_golden_llama cells --json` lines (model, route, seed, script, agree,
finding, repro). A divergent script is a finding `cells model=M route=R script=S` with
its finding text as the message; it must match an entry of the register (op `cells`,
filters model=, route=, raise~=REGEX on the finding), and every entry must match a finding
of the run, or the run fails (exit 1). Columns: scripts, agree, one per class,
unclassified (printed with its repro). Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "adapters" / "mlx"))
from kvlab_mlx import known  # noqa: E402  (standard library only: no MLX import)

COLUMNS = ("scripts", "agree", "representation", "upstream-bug", "kvlab-bug", "unclassified")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+")
    p.add_argument("--known", required=True)
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    rows = []
    for f in args.results:
        rows.extend(json.loads(line) for line in pathlib.Path(f).read_text().splitlines() if line.strip())
    if not rows:
        print("cell_replay_table: no results (a gate with nothing to check fails)")
        return 1
    entries = known.read(args.known)
    findings, line_of = [], {}
    for r in rows:
        if not r["agree"]:
            line = f"cells model={r['model']} route={r['route']} script={r['script']}"
            findings.append((line, r["finding"]))
            line_of[line] = r
    lines, ok = known.judge(entries, findings)
    klass = {hit: e.klass for e in entries for hit in e.hits}
    counts = collections.defaultdict(collections.Counter)
    for r in rows:
        key = (r["model"], r["route"])
        counts[key]["scripts"] += 1
        if r["agree"]:
            counts[key]["agree"] += 1
        else:
            line = f"cells model={r['model']} route={r['route']} script={r['script']}"
            counts[key][klass.get(line, "unclassified")] += 1
            if line not in klass:
                print(f"UNCLASSIFIED: {r['finding']}\n  repro: {r['repro']}")
    out = ["| model | route | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for (model, route), c in sorted(counts.items()):
        out.append(f"| {model} | {route} | " + " | ".join(str(c[k]) for k in COLUMNS) + " |")
    print("\n".join(out))
    for line in lines:
        if not line.startswith("UNLISTED"):
            print(line)
    if args.markdown:
        pathlib.Path(args.markdown).write_text("\n".join(out) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
