"""Which tests can see a mutant: a per-test coverage map of the production folders
(docs/mutation.md §Coverage-guided selection).

The map is measured once on the mutate-cov preset (the mutate preset's tests under clang
source-based coverage, whose counters are exact at any optimization level): every test
of the cheap labels runs alone with its own profile, and the map records, per test, the
functions it entered, and for the whole run every executable line of the production
folders with the functions whose code spans it. It is stored in the coverage build dir,
keyed by a hash of the tree it was measured on; tools/mutate.py refuses a map of another
tree. tools/mutate/coverage_run.py builds it.
"""
import glob
import hashlib
import json
import os
import re
import subprocess

# What cannot change which production lines a test executes: the documentation and the
# mutation tool itself with its tests. Everything else (sources, tests, case files,
# goldens, CMake files) is in the key.
KEY_EXCLUDED_PREFIXES = ("docs/", "tools/mutate/", "tools/mutate.py", "tools/mutate.sh", "tools/test_mutate.py")
MAP_NAME = "coverage-map.json"


def _journals(root):
    """{path: original text} of the files a mutation run holds mutated right now (its
    restore.json journal, tools/mutate.py's Restorer), so a map built beside a running
    mutation run is keyed by the unmutated tree."""
    held = {}
    for j in glob.glob(os.path.join(root, "build", "*", "restore.json")) + \
            glob.glob(os.path.join(root, "build", "*", "*", "restore.json")):
        try:
            with open(j) as f:
                d = json.load(f)
            held[d["path"]] = d["text"]
        except (OSError, ValueError, KeyError):
            continue  # removed while read: that file is restored
    return held


def held_files(root):
    """The files a mutation run holds mutated right now."""
    return sorted(_journals(root))


def _key_once(root):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                           capture_output=True, check=True).stdout.decode().split("\0")
    before = _journals(root)
    contents = {}
    for path in sorted(set(f for f in files if f)):
        if path.endswith(".md") or path.startswith(KEY_EXCLUDED_PREFIXES):
            continue
        full = os.path.join(root, path)
        if os.path.isfile(full):  # else deleted in the working tree
            with open(full, "rb") as f:
                contents[path] = f.read()
    after = _journals(root)
    for path, text in {**before, **after}.items():
        if path in contents:
            contents[path] = text.encode()
    h = hashlib.sha1()
    for path in sorted(contents):
        h.update(path.encode() + b"\0" + hashlib.sha1(contents[path]).digest())
    return h.hexdigest(), before, after


def tree_key(root):
    """sha1 of every tracked or untracked, non-ignored file but the excluded ones, the
    originals of files held mutated standing in for them. Computed until two passes agree,
    so a mutant written or restored during a pass does not leak into the key."""
    last = None
    for _ in range(10):
        key, before, after = _key_once(root)
        if before == after and key == last:
            return key
        last = key
    raise RuntimeError("the tree kept changing while it was hashed")


def compile_time_lines(text):
    """Line numbers (1-based) of code that may run in the compiler: constexpr, consteval
    and constinit declarations and function bodies, whose effect coverage cannot see (a
    constexpr function folded into a constant never runs, yet a mutant there changes the
    constant). Scanned on the text: from the keyword to the `;` or the closing brace that
    ends the declaration."""
    lines = set()
    for m in re.finditer(r"\b(constexpr|consteval|constinit)\b", text):
        if re.search(r"\bif\s*$", text[max(0, m.start() - 20):m.start()]):
            continue  # `if constexpr`: a runtime statement with a compile-time branch choice
        depth, i, end = 0, m.end(), len(text)
        while i < len(text):
            c = text[i]
            if c in "({[":
                depth += 1
            elif c in ")}]":
                depth -= 1
                if depth == 0 and c == "}":
                    end = i
                    break
            elif c == ";" and depth == 0:
                end = i
                break
            i += 1
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, end) + 1
        lines.update(range(first, last + 1))
    return lines


def normalized(test, build_dir):
    """A test's command line and environment with its build dir taken out: the same test
    in the mutate build and in the coverage build compare equal (a changed explore seed,
    RC_PARAMS in the environment, does not)."""
    cmd = [a.replace(build_dir, "<build>") for a in test["command"][1:]]
    env = sorted(e.replace(build_dir, "<build>") for e in test.get("env", []))
    exe = os.path.basename(test["command"][0]) if test["command"] else ""
    return json.dumps([exe, cmd, env])


def ctest_tests(build_dir, cheap, never):
    """{name: {number, command, env, labels, cwd, timeout, serial, will_fail, skip_rc,
    skip_re, pass_re, fail_re}} of the tests in build_dir that carry a cheap label and no
    never label; number is ctest's (-I), the position in its list."""
    build_dir = os.path.abspath(build_dir)
    r = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ctest --show-only in {build_dir} failed: {r.stderr.strip()[-500:]}")
    tests = {}
    for number, t in enumerate(json.loads(r.stdout)["tests"], 1):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        if not set(labels) & set(cheap) or set(labels) & set(never) or not t.get("command"):
            continue
        tests[t["name"]] = {"number": number, "command": t["command"], "env": props.get("ENVIRONMENT", []),
                            "labels": labels, "cwd": props.get("WORKING_DIRECTORY", build_dir),
                            "timeout": props.get("TIMEOUT", 1500), "serial": bool(props.get("RUN_SERIAL")),
                            "will_fail": bool(props.get("WILL_FAIL")),
                            "skip_rc": props.get("SKIP_RETURN_CODE"),
                            "skip_re": props.get("SKIP_REGULAR_EXPRESSION", []),
                            "pass_re": props.get("PASS_REGULAR_EXPRESSION", []),
                            "fail_re": props.get("FAIL_REGULAR_EXPRESSION", [])}
        tests[t["name"]]["signature"] = normalized(tests[t["name"]], build_dir)
    return tests


class Map:
    """A loaded coverage map, answering which tests a mutant on (file, line) needs."""

    def __init__(self, path):
        with open(path) as f:
            d = json.load(f)
        self.key, self.build_dir = d["key"], d["build_dir"]
        self.tests = d["tests"]            # name -> {status, labels, signature, functions: [ids]}
        # Blind tests (coverage_run.FORKING) also cover every line of these files.
        self.child_files = set(d.get("child_files", []))
        self.blind = {n for n, t in self.tests.items() if t["status"] == "blind"}
        self.lines = d["lines"]            # file -> {line: [count, [function ids]]}, executable lines
        self.entered = {}                  # function id -> set of test names
        for name, t in self.tests.items():
            for fid in t["functions"]:
                self.entered.setdefault(fid, set()).add(name)

    def unknown(self, tests_now):
        """Tests whose coverage the map cannot vouch for: absent from it, run with other
        arguments or environment, or not passing when it was measured. They run for
        every mutant that runs any test."""
        out = set()
        for name, t in tests_now.items():
            m = self.tests.get(name)
            if m is None or m["status"] not in ("passed", "skipped", "blind") or m["signature"] != t["signature"]:
                out.add(name)
        return out

    def select(self, path, line, compile_time):
        """('all', reason) or ('covering', set of tests; empty: no test executes it)."""
        if line in compile_time:
            return "all", "compile-time code (constexpr/consteval)"
        entry = self.lines.get(path, {}).get(str(line))
        if entry is None:
            return "all", "not an executable line"
        count, funcs = entry
        # a forked child may have run the line where no profile saw it
        children = self.blind if path in self.child_files else set()
        if count == 0:
            return "covering", children  # no profiled process executed it
        if not funcs:
            return "all", "executed, but in no function the map knows"
        # Every test that entered a function whose code spans the line: a superset of
        # the tests that executed the line itself (the map is per function per test).
        return "covering", children.union(*(self.entered.get(f, set()) for f in funcs))
