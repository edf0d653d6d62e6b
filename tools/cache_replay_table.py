#!/usr/bin/env python3
"""The cache replay's table: per cache kind, how many scripts were replayed through
mlx-lm and how each ended, every divergence by class.

  tools/cache_replay_table.py REPLAY_JSON... JUDGED_JSONL [--markdown]

REPLAY_JSON: `python -m kvlab_mlx run --report-json` (computed / skipped / finding per
problem), one or more; JUDGED_JSONL: `kvlab check --vectors ... --json` over the computed problems.
Columns: scripts; agree (PASSED); divergences listed in the register, by class (kvlab
check's SKIPPED "known divergence (<class>, ...)", and the adapter's findings);
unclassified (FAILED, INVALID, unlisted findings: the run fails on any); not replayed
(mlx-lm has no counterpart). Standard library only.
"""

from __future__ import annotations

import collections
import json
import re
import sys

CLASSES = ("representation", "upstream-bug", "kvlab-bug")


def kind_of(line: str) -> str:
    m = re.search(r"\bkind=(\S+)", line)
    return m.group(1) if m else "?"


def table(replay, judged):
    rows = collections.defaultdict(collections.Counter)
    for r in replay:
        k = kind_of(r["line"])
        rows[k]["scripts"] += 1
        if r["outcome"] == "skipped":
            rows[k]["not replayed"] += 1
        elif r["outcome"] == "finding":
            rows[k][r["class"] if r["class"] in CLASSES else "unclassified"] += 1
    for r in judged:
        k = kind_of(r["case"])
        status, reason = r["status"], r.get("reason", "")
        m = re.match(r"known divergence \(([a-z-]+),", reason)
        if status == "PASSED":
            rows[k]["agree"] += 1
        elif status == "SKIPPED" and m:
            rows[k][m.group(1)] += 1
        else:
            rows[k]["unclassified"] += 1
    return rows


def render(rows, markdown=False):
    cols = ["scripts", "agree", *CLASSES, "unclassified", "not replayed"]
    out = []
    if markdown:
        out.append("| kind | " + " | ".join(cols) + " |")
        out.append("|---|" + "---|" * len(cols))
    else:
        out.append(f"{'kind':16}" + "".join(f"{c:>15}" for c in cols))
    total = collections.Counter()
    for kind in sorted(rows):
        total.update(rows[kind])
    for kind, counts in [*sorted(rows.items()), ("all", total)]:
        if markdown:
            out.append(f"| {kind} | " + " | ".join(str(counts[c]) for c in cols) + " |")
        else:
            out.append(f"{kind:16}" + "".join(f"{counts[c]:>15}" for c in cols))
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    replay = []
    for path in args[:-1]:
        with open(path, encoding="utf-8") as f:
            replay += json.load(f)
    with open(args[-1], encoding="utf-8") as f:
        judged = [json.loads(line) for line in f if line.strip()]
    for line in render(table(replay, judged), "--markdown" in argv):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
