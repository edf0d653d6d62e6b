#!/usr/bin/env python3
"""Print kvlab's registers of known divergences (harness/known/*) as one table: entry id
(the D#/C# its note ends with), engine, op and filters, class, note; and how many
upstream bugs have no upstream issue yet (their note cites none: no `#NNN`).

  tools/registers.py [FILE...]     (default: every file in harness/known/)
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "adapters" / "mlx"))
from kvlab_mlx import known  # noqa: E402  (standard library only: no MLX import)


def entries(path: pathlib.Path):
    """The register's entries, read by the adapter's reader (one parser of the format)."""
    for e in known.read(str(path)):
        ident = re.findall(r"\b([A-Z][0-9]+)\)\s*$", e.note)
        yield {"where": e.where, "id": ident[0] if ident else "-", "engine": e.engine, "filter": e.filter,
               "class": e.klass, "note": e.note}


def main(argv):
    files = [pathlib.Path(a).resolve() for a in argv] or sorted((ROOT / "harness" / "known").iterdir())
    counts = collections.Counter()
    no_issue = set()
    for f in files:
        rows = list(entries(f))
        print(f"== {f.relative_to(ROOT)} ({len(rows)} entries)")
        for e in rows:
            counts[e["class"]] += 1
            upstream_ref = re.search(r"(#[0-9]+|PR [0-9]+)", e["note"])
            if e["class"] == "upstream-bug" and not upstream_ref:
                no_issue.add(e["id"] if e["id"] != "-" else e["where"])
            print(f"  {e['id']:4} {e['class']:15} {e['filter']}")
            print(f"       {e['note']}")
    print("classes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
          f"; upstream bugs without an upstream issue (found first by kvlab): {len(no_issue)} "
          f"({', '.join(sorted(no_issue))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
