#!/usr/bin/env python3
"""The cache replay's table: per cache kind, how many scripts were replayed through
mlx-lm and how each ended, every divergence by class.

  tools/cache_replay_table.py REPLAY_JSON... JUDGED_JSONL [--markdown] [--hits HITS_JSONL]

REPLAY_JSON: `python -m kvlab_mlx run --report-json` (computed / skipped / finding per
problem), one or more; JUDGED_JSONL: `kvlab check --vectors ... --json` over the computed problems.
Columns: scripts; agree (PASSED); divergences listed in the register, by class (kvlab
check's SKIPPED "known divergence (<class>, ...)", and the adapter's findings);
unclassified (FAILED, INVALID, unlisted findings: the run fails on any); not replayed
(mlx-lm has no counterpart). With --hits (the prefix replay's KVLAB_PREFIX_HITS file:
one line per request, the kind of hit kvlab's rule gives it) the rows are kind × hit
kind (exact, prefix, supersequence, lcp, miss; "after trim" for a hit that came after
the live cache was trimmed): a script that agrees counts under every hit kind its
requests reached; a divergent one only under the kind of the last request it reached
(where the adapter stopped it, or the one whose answer the final content reflects).
Standard library only.
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


def table(replay, judged, hits=None):
    """rows: per kind (or kind and hit kind), and "all" counting each script once."""
    rows = collections.defaultdict(collections.Counter)

    def keys_of(line, agreed=False):
        k = kind_of(line)
        if hits is None:
            return [k, "all"]
        reached, last = hits.get(line, ({"no request"}, {"no request"}))
        return [f"{k} {h}" for h in sorted(reached if agreed else last)] + ["all"]

    def count(line, column):
        for k in keys_of(line, column in ("agree", "not replayed")):
            rows[k][column] += 1

    for r in replay:
        if r["outcome"] == "skipped":
            count(r["line"], "not replayed")
        elif r["outcome"] == "finding":
            count(r["line"], r["class"] if r["class"] in CLASSES else "unclassified")
    for r in judged:
        status, reason = r["status"], r.get("reason", "")
        m = re.match(r"known divergence \(([a-z-]+),", reason)
        if status == "PASSED":
            count(r["case"], "agree")
        elif status == "SKIPPED" and m:
            count(r["case"], m.group(1))
        else:
            count(r["case"], "unclassified")
    for counts in rows.values():
        counts["scripts"] = sum(counts[c] for c in ("agree", *CLASSES, "unclassified", "not replayed"))
    return rows


def render(rows, markdown=False):
    cols = ["scripts", "agree", *CLASSES, "unclassified", "not replayed"]
    out = []
    if markdown:
        out.append("| kind | " + " | ".join(cols) + " |")
        out.append("|---|" + "---|" * len(cols))
    else:
        out.append(f"{'kind':28}" + "".join(f"{c:>15}" for c in cols))
    for kind, counts in [*sorted((k, c) for k, c in rows.items() if k != "all"), ("all", rows["all"])]:
        if markdown:
            out.append(f"| {kind} | " + " | ".join(str(counts[c]) for c in cols) + " |")
        else:
            out.append(f"{kind:28}" + "".join(f"{counts[c]:>15}" for c in cols))
    return out


def read_hits(path):
    """problem line -> (the hit kinds its requests reached, the kind of the last one)."""
    reached, last = collections.defaultdict(set), {}
    with open(path, encoding="utf-8") as f:
        for text in f:
            if text.strip():
                h = json.loads(text)
                kinds = {h["hit"]} | ({"after trim"} if h["after_trim"] and h["hit"] != "miss" else set())
                reached[h["line"]] |= kinds
                last[h["line"]] = kinds
    return {line: (reached[line], last[line]) for line in reached}


def main(argv):
    hits = None
    if "--hits" in argv:
        i = argv.index("--hits")
        hits = read_hits(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
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
    for line in render(table(replay, judged, hits), "--markdown" in argv):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
