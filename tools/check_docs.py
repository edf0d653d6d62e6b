#!/usr/bin/env python3
"""Citations stay inside the repository.

Fails (exit 1) when a tracked file
  * cites a document that is not in the repository (the background spec, DESIGN.md,
    toolchain.md, kvquant-anchors, their numbered sections "spec §4.3", "§7 row 25",
    "Appendix B.4"), string literals included (LITERALS lists none), or
  * refers to a docs/ file, heading, anchor or table row that does not exist
    ("docs/semantics.md §Rotating cache", "docs/semantics.md#rotating-cache",
    "docs/upstream-bugs.md row 25", "docs/traces.md §T3"); references to other tracked
    Markdown files with a section ("adapters/mlx/DIVERGENCES.md §2b") and relative links
    inside Markdown ("[x](semantics.md#kv-cache)") are checked the same way.

Python 3 standard library only. CTest: docs.citations (label unit).
Usage: tools/check_docs.py [--root DIR] [--verbose]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

# docs/ files another change is writing: a reference to one is "pending" while the file
# does not exist, and checked like any other once it does.
PENDING = {"docs/large-files.md", "docs/plugins.md"}

# String literals allowed to cite the background documents, with their exact count per
# file (a new one fails, a removed one asks for the table to shrink). None is left: the
# zoo's mutant descriptions, the selfcheck labels and the register notes cite docs/.
LITERALS: dict[str, int] = {}

# Files this checker does not scan for outside citations: itself and its tests (they spell
# the patterns out).
SELF = {"tools/check_docs.py", "tools/test_check_docs.py"}

_SPEC = r"[Ss]pec(?:'s|\u2019s)?"
OUTSIDE = [
    ("spec section", re.compile(_SPEC + r"\s*\u00a7")),
    ("spec appendix", re.compile(_SPEC + r"\s+(?:[Aa]ppendix|[Aa]pp\.)")),
    ("spec by number", re.compile(r"\bspec:?\s+\d")),
    ("the spec", re.compile(r"\b(?:[Tt]he|shared) spec\b(?!\w)")),
    ("appendix", re.compile(r"\b(?:Appendix|App\.)\s+[A-C]\b")),
    ("numbered section", re.compile(r"(?<![\w\u00a7])\u00a7\s?\d")),
    ("DESIGN.md", re.compile(r"(?<![\w./\[-])(?<!\]\()DESIGN\.md")),
    ("toolchain.md", re.compile(r"(?<![\w./\[-])(?<!\]\()toolchain\.md")),
    ("kvquant-anchors", re.compile(r"kvquant-anchors|anchors\s+\d\.[A-Z]")),
    ("mlx-cache-spec", re.compile(r"mlx-cache-spec")),
]

# A Markdown path, as a citation writes it: docs/x.md, adapters/mlx/DIVERGENCES.md, or a
# bare x.md (resolved relative to the citing file, for links inside docs/).
MD_PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)*[\w.-]+\.md)(#[\w-]+)?")
SECTION_ID = re.compile(r"[A-Za-z]?\d+[a-z]?\b|[A-Z]+\d+\b")
ROWS = re.compile(r"\s+rows?\s+(\d+(?:\s*(?:,|/|and|\u2013|-)\s*\d+)*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
TABLE_ROW = re.compile(r"^\|\s*(\d+)\s*\|")
CODE_SUFFIXES = (".c", ".cc", ".h", ".hpp", ".cpp", ".py", ".comp", ".glsl", ".cmake", ".in")


@dataclass
class MarkdownFile:
    headings: list[str] = field(default_factory=list)
    slugs: set[str] = field(default_factory=set)
    rows: set[int] = field(default_factory=set)


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return s.replace(" ", "-")


def first_token(title: str) -> str:
    return title.split()[0].rstrip(".:") if title.split() else ""


def tracked_files(root: str) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout
        files = sorted({f for f in out.decode().split("\0") if f})
        return [f for f in files if os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in (".git", "build", ".cache", "__pycache__")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return sorted(files)


def read_text(path: str) -> str | None:
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_markdown(text: str) -> MarkdownFile:
    md = MarkdownFile()
    in_fence = False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        h = HEADING.match(line)
        if h:
            md.headings.append(h.group(2))
            md.slugs.add(slug(h.group(2)))
        r = TABLE_ROW.match(line)
        if r:
            md.rows.add(int(r.group(1)))
    return md


def literal_spans(line: str) -> list[tuple[int, int]]:
    """Spans of double-quoted string literals on one line of C/C++/Python code."""
    spans, i, start, quote = [], 0, None, None
    while i < len(line):
        c = line[i]
        if quote is None:
            if line.startswith("//", i) or c == "#" and line[:i].strip() == "":
                break
            if c == '"':
                quote, start = c, i
        elif c == "\\":
            i += 1
        elif c == quote:
            spans.append((start, i + 1))
            quote = None
        i += 1
    if quote is not None:
        spans.append((start, len(line)))
    return spans


def in_literal(path: str, line: str, pos: int) -> bool:
    if path.endswith(CODE_SUFFIXES):
        return any(a <= pos < b for a, b in literal_spans(line))
    # Register files: an entry line (not a '#' comment) is data a program prints.
    return not line.lstrip().startswith("#")


class Checker:
    def __init__(self, root: str, verbose: bool = False):
        self.root = root
        self.verbose = verbose
        self.files = tracked_files(root)
        self.tracked = set(self.files)
        self.markdown: dict[str, MarkdownFile] = {}
        self.outside: list[str] = []
        self.dangling: list[str] = []
        self.pending: set[str] = set()
        self.literals: dict[str, int] = {}
        self.references = 0

    def md(self, path: str) -> MarkdownFile:
        if path not in self.markdown:
            self.markdown[path] = parse_markdown(read_text(os.path.join(self.root, path)) or "")
        return self.markdown[path]

    def resolve(self, citing: str, written: str) -> str | None:
        """The tracked path a citation means, or None when it is not a repository path."""
        if written in self.tracked or written in PENDING or written.startswith("docs/"):
            return written
        rel = os.path.normpath(os.path.join(os.path.dirname(citing), written))
        if rel in self.tracked:
            return rel
        return None

    def heading_at(self, md: MarkdownFile, text: str) -> int | None:
        """Length of the citation text a heading of `md` accounts for, or None."""
        best = None
        for h in md.headings:
            if text.startswith(h) and (len(text) == len(h) or not text[len(h)].isalnum()):
                best = max(best or 0, len(h))
        m = SECTION_ID.match(text)
        if best is None and m and any(first_token(h) == m.group(0) for h in md.headings):
            best = len(m.group(0))
        return best

    def check_reference(self, where: str, path: str, line: str, m: re.Match) -> None:
        self.references += 1
        full = os.path.join(self.root, path)
        if not os.path.isfile(full):
            if path in PENDING:
                self.pending.add(path)
            else:
                self.dangling.append(f"{where}: {path} does not exist")
            return
        md = self.md(path)
        if m.group(2) and m.group(2)[1:] not in md.slugs:
            self.dangling.append(f"{where}: {path} has no heading with anchor {m.group(2)}")
        rest, pos = line[m.end():], 0
        pos += len(rest) - len(rest.lstrip("`'\""))
        # "§Heading", possibly several: "§U5, §U6".
        while True:
            sec = re.match(r"\s*(?:,|and|/)?\s*\u00a7\s?", rest[pos:])
            if not sec:
                break
            pos += sec.end()
            text = rest[pos:]
            length = self.heading_at(md, text)
            if length is None:
                shown = re.split(r"[`)(;]", text)[0].strip()
                self.dangling.append(f"{where}: {path} has no heading '\u00a7{shown}'")
                break
            pos += length
            pos += len(rest[pos:]) - len(rest[pos:].lstrip("`'\""))
        rows = ROWS.match(rest[pos:])
        if rows:
            for n in (int(x) for x in re.findall(r"\d+", rows.group(1))):
                if n not in md.rows:
                    self.dangling.append(f"{where}: {path} has no table row {n}")

    def scan(self, path: str, text: str) -> None:
        if path in SELF:
            return
        for no, line in enumerate(text.split("\n"), 1):
            where = f"{path}:{no}"
            masked = line
            for m in MD_PATH.finditer(line):
                target = self.resolve(path, m.group(1))
                if target is None:
                    continue
                if (target.startswith("docs/") or line[m.end():].lstrip("`'\" ").startswith("\u00a7")
                        or m.group(2) or line[:m.start()].endswith("](")):
                    self.check_reference(where, target, line, m)
                # A section cited after an in-repository path is that file's, not the spec's.
                tail = re.match(r"[`'\"]?(?:\s*(?:,|and|/)?\s*\u00a7\s?[\w.]+)+", line[m.end():])
                if tail:
                    a, b = m.end(), m.end() + tail.end()
                    masked = masked[:a] + " " * (b - a) + masked[b:]
            # One citation may match several patterns ("spec §4.5"): count overlapping
            # or touching matches once.
            hits = sorted((o.start(), o.end(), name) for name, pattern in OUTSIDE for o in pattern.finditer(masked))
            merged: list[list] = []
            for a, b, name in hits:
                if merged and a <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b, name])
            for a, _, name in merged:
                if path in LITERALS and in_literal(path, line, a):
                    self.literals[path] = self.literals.get(path, 0) + 1
                else:
                    self.outside.append(f"{where}: {name}: {line.strip()[:160]}")

    def run(self) -> int:
        for path in self.files:
            text = read_text(os.path.join(self.root, path))
            if text is not None:
                self.scan(path, text)
        literal_errors = []
        for path in sorted(set(LITERALS) | set(self.literals)):
            want, got = LITERALS.get(path, 0), self.literals.get(path, 0)
            if want != got:
                literal_errors.append(f"{path}: {got} citation(s) in string literals, LITERALS says {want}")
        print(f"check_docs: {len(self.files)} files, {self.references} docs references")
        print(f"  outside citations: {len(self.outside)}")
        for e in self.outside:
            print("    " + e)
        print(f"  dangling references: {len(self.dangling)}")
        for e in self.dangling:
            print("    " + e)
        print(f"  pending docs (not written yet): {', '.join(sorted(self.pending)) or 'none'}")
        print(f"  string literals left as printed output: {sum(self.literals.values())} in {len(self.literals)} files")
        if self.verbose:
            for p, n in sorted(self.literals.items()):
                print(f"    {p}: {n}")
        for e in literal_errors:
            print("    LITERALS mismatch: " + e)
        ok = not self.outside and not self.dangling and not literal_errors
        print("check_docs: " + ("OK" if ok else "FAILED"))
        return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    return Checker(args.root, args.verbose).run()


if __name__ == "__main__":
    sys.exit(main())
