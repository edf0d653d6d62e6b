"""The register format of harness/known_divergences.h, read by the adapter for what kvlab
never sees: problems on which the engine raised, or whose cache content differs in
length (no outputs reach a vectors file).

    <engine> | <op> key=value[,value...] ... | <class> | <note>

A problem matches an entry when its op is <op> and each listed key's value is one of the
listed values (unlisted keys match anything). The adapter's entries may also filter with
`key~=REGEX` (re.search on the value; no spaces) and `raise~=REGEX` on the engine's
message, so one entry covers every script with the same cause. Every finding must match an entry and
every entry must match a finding of the run, or the run fails: the register stays true.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .problem import Problem

CLASSES = ("upstream-bug", "representation", "kvlab-bug")


@dataclass
class Entry:
    where: str
    engine: str
    op: str
    filter: str  # the filter column as written
    match: dict
    klass: str
    note: str
    hits: list = field(default_factory=list)  # problem lines
    messages: list = field(default_factory=list)

    def matches(self, p: Problem, message: str = "") -> bool:
        if p.op != self.op:
            return False
        for key, want in self.match.items():
            value = message if key == "raise" else p.params.get(key)
            if value is None:
                return False
            if isinstance(want, re.Pattern) and not want.search(value):
                return False
            if isinstance(want, set) and value not in want:
                return False
        return True


def read(path: str):
    entries = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
            if not line:
                continue
            where = f"{path}:{n}"
            cols = [c.strip() for c in line.split("|")]
            if len(cols) != 4 or not all(cols[:3]):
                raise ValueError(f"{where}: expected 'engine | op key=value ... | class | note'")
            engine, filt, klass, note = cols
            if klass not in CLASSES:
                raise ValueError(f"{where}: class {klass!r} is not one of {', '.join(CLASSES)}")
            words = filt.split()
            match = {}
            for w in words[1:]:
                key, eq, values = w.partition("=")
                if not eq or not values:
                    raise ValueError(f"{where}: {w!r} is not key=value[,value...] or key~=regex")
                if key.endswith("~"):
                    try:
                        match[key[:-1]] = re.compile(values)
                    except re.error as e:
                        raise ValueError(f"{where}: {w!r}: bad regex: {e}") from None
                else:
                    match[key] = set(values.split(","))
            entries.append(Entry(where, engine, words[0], filt, match, klass, note))
    return entries


def judge(entries, raised):
    """raised: [(problem line, message)], the run's findings. Returns (lines to print, ok)."""
    out, ok = [], True
    for line, message in raised:
        p = Problem(line)
        entry = next((e for e in entries if e.matches(p, message)), None)
        if entry is None:
            ok = False
            out.append(f"UNLISTED finding: {line}\n    {message}")
        else:
            entry.hits.append(line)
            entry.messages.append(message)
    for e in entries:
        if e.hits:
            out.append(f"  {len(e.hits):4d} finding(s)  {e.klass}  {e.where}: {e.note}")
        else:
            ok = False
            out.append(f"STALE entry {e.where} (no finding matched it): {e.note}")
    return out, ok
