"""--recheck-fixed REPORT: the survivors of an earlier run triaged `fixed` (a test added
since kills each), run again on the current tree, so that the report's `+ fixed` column is
a measurement and not only the triager's word.

A report's mutant names a line of the tree it ran on. In the current tree the same
original text is looked for in the same file (the nearest occurrence to the old line
number, as edits above it move it); the mutated line replaces it. When the text is gone
(the code was rewritten by the fix) the mutant cannot be rebuilt: it is `gone`, which the
summary names apart and never counts as killed.
"""
import json
import os


def locate(lines, original, old_line):
    """1-based number of the line of `lines` whose text, stripped, equals `original`
    stripped, the nearest to old_line; None when no line does."""
    want = original.strip()
    hits = [i + 1 for i, text in enumerate(lines) if text.strip() == want]
    return min(hits, key=lambda n: (abs(n - old_line), n)) if hits else None


def fixed_survivors(report_dir, triage, find_triage):
    """The report's survivors whose survivors.txt class is `fixed`, in report order."""
    out = []
    with open(os.path.join(report_dir, "mutants.jsonl")) as f:
        for raw in f:
            if not raw.strip():
                continue
            r = json.loads(raw)
            hit = find_triage(triage, r["id"]) if r["status"] == "survived" else None
            if hit and hit[0] == "fixed":
                out.append(r)
    return out


def moved(record, root):
    """The record with `line` set to where its original text is now, or None (gone)."""
    path = os.path.join(root, record["file"])
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = f.read().splitlines()
    n = locate(lines, record["original"], record["line"])
    return None if n is None else dict(record, line=n)


def summary(results):
    """Lines for the results [(record, status, killing test or None)]."""
    counts = {}
    lines = []
    for r, status, failing in results:
        counts[status] = counts.get(status, 0) + 1
        lines.append(f"  {status:<9} {r['id']}" + (f"  ({failing})" if failing else ""))
    total = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return [f"recheck of {len(results)} fixed survivors on the current tree: {total}"] + lines
