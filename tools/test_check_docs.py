#!/usr/bin/env python3
"""The rules of tools/check_docs.py on small synthetic trees (CTest docs.checker_rules)."""
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
import unittest

SCRIPT = os.environ.get("KVLAB_CHECK_DOCS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_docs.py"))
spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
cd = importlib.util.module_from_spec(spec)
sys.modules["check_docs"] = cd  # dataclasses look their module up there
spec.loader.exec_module(cd)

DOC = """# Title

## Rotating cache

Text.

### U4 Chunked reload

| # | what |
|---|---|
| 25 | a row |
"""


class Tree:
    def __init__(self, files):
        self.dir = tempfile.TemporaryDirectory()
        for path, text in files.items():
            full = os.path.join(self.dir.name, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)

    def check(self, literals=None):
        old = cd.LITERALS
        cd.LITERALS = literals or {}
        try:
            checker = cd.Checker(self.dir.name)
            with contextlib.redirect_stdout(io.StringIO()):
                rc = checker.run()
            return rc, checker
        finally:
            cd.LITERALS = old
            self.dir.cleanup()


def run(code, literals=None, extra=None):
    files = {"docs/semantics.md": DOC, "src/a.cc": code}
    files.update(extra or {})
    return Tree(files).check(literals)


class CheckDocsRules(unittest.TestCase):
    def test_resolving_citations_pass(self):
        rc, c = run("// see docs/semantics.md §Rotating cache, docs/semantics.md#rotating-cache,\n"
                    "// docs/semantics.md §U4, docs/semantics.md row 25\n")
        self.assertEqual((rc, c.outside, c.dangling), (0, [], []))
        self.assertEqual(c.references, 4)

    def test_outside_documents_fail(self):
        for text in ["// spec §4.3", "// (§7 row 25)", "// Appendix B.4", "# toolchain.md §6",
                     "// DESIGN.md \"Errors\"", "// kvquant-anchors §6.A.1", "// as the spec says"]:
            with self.subTest(text=text):
                rc, c = run(text + "\n")
                self.assertEqual(rc, 1)
                self.assertEqual(len(c.outside), 1, c.outside)

    def test_a_section_of_an_in_repository_file_is_not_outside(self):
        rc, c = run("// adapters/x/NOTES.md §2b\n", extra={"adapters/x/NOTES.md": "## 2b. Files\n"})
        self.assertEqual((rc, c.outside, c.dangling), (0, [], []))

    def test_dangling_references_fail(self):
        for text in ["// docs/semantics.md §Rotating", "// docs/semantics.md#nope", "// docs/semantics.md §U9",
                     "// docs/semantics.md row 26", "// docs/missing.md", "// adapters/x/NOTES.md §3"]:
            with self.subTest(text=text):
                rc, c = run(text + "\n", extra={"adapters/x/NOTES.md": "## 2b. Files\n"})
                self.assertEqual(rc, 1)
                self.assertEqual(len(c.dangling), 1, c.dangling)

    def test_pending_docs_are_tolerated_until_they_exist(self):
        pending = sorted(cd.PENDING)[0]
        rc, c = run(f"// {pending} §Anything\n")
        self.assertEqual(rc, 0)
        self.assertEqual(c.pending, {pending})
        rc, c = run(f"// {pending} §Anything\n", extra={pending: "# Title\n\n## Something else\n"})
        self.assertEqual(rc, 1)
        self.assertEqual(len(c.dangling), 1)

    def test_string_literals_are_counted_exactly(self):
        code = 'out.push_back(mutant("x", "bug (§7 row 2)"));  // docs/semantics.md §Rotating cache\n'
        self.assertEqual(run(code, {"src/a.cc": 1})[0], 0)
        self.assertEqual(run(code, {"src/a.cc": 2})[0], 1)  # a removed literal shrinks the table
        self.assertEqual(run(code)[0], 1)  # a literal nobody listed
        rc, c = run(code.replace("// docs", "// spec §4.3 and docs"), {"src/a.cc": 1})
        self.assertEqual((rc, len(c.outside)), (1, 1))  # comments are never allow-listed


if __name__ == "__main__":
    unittest.main()
