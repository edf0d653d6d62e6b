#!/usr/bin/env python3
"""Mutation testing of kvlab's production code (docs/mutation.md).

Mutants come from universalmutator's C++ regex rules (universal, cpp and c_like: what
`mutate FILE cpp --noCheck` generates), taken from its library in the pinned venv
(tools/mutate/setup_venv.sh); this script is run by tools/mutate.sh inside that venv.
Each mutant is written in place (the original kept in memory and on disk, and restored
on exit, Ctrl-C or an exception), the mutate preset's build dir is rebuilt
incrementally, and ctest runs the labels that cover the mutant's folder with
--stop-on-failure, then the other cheap labels (tools/mutate/labels.txt).

  tools/mutate.sh --diff BASE [--time-box MIN]   mutants on the lines changed since BASE
  tools/mutate.sh --diff BASE --paths P [P ...]  ... in these files or folders only
  tools/mutate.sh --sample N --seed S            a seeded sample of the whole tree
  tools/mutate.sh --sample N --seed S --list     the mutants alone, nothing built
  tools/mutate.sh --recheck-fixed REPORT_DIR     an earlier run's `fixed` survivors, run again

Outcomes: killed, survived, timeout, build_error, not_built (no object of the build
depends on the mutated file: nothing could run it). Report: OUT/mutants.jsonl (one JSON
object a mutant, written as it finishes) and OUT/summary.txt (per folder; score =
detected / (killed + survived + timeout), detected = killed + the timeouts of a test
past its own CTest timeout, which fails CI as a failing test does). Survivors listed in tools/mutate/survivors.txt
are marked with their triage class.
"""
import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tools", "mutate")
sys.path.insert(0, DATA)
import coverage  # noqa: E402  (tools/mutate/coverage.py)
import recheck  # noqa: E402  (tools/mutate/recheck.py)
import resume  # noqa: E402  (tools/mutate/resume.py)
RULES = ["universal.rules", "cpp.rules", "c_like.rules"]  # `mutate FILE cpp`'s rule set
EXTS = (".cc", ".cpp", ".h", ".hpp", ".inl")
# A ctest result line: "  3/10 Test  #7: name ......***Failed  0.1 sec" (or ***Timeout,
# ***Exception: SegFault, "Subprocess aborted***Exception:").
FAIL_RE = re.compile(r"Test\s+#\d+: (\S+) .*?(\*\*\*Timeout|\*\*\*Failed|\*\*\*Exception|Subprocess aborted"
                     r"|\*\*\*Not Run)")


# ctest's last line: "100% tests passed, 0 tests failed out of 12"
RAN_RE = re.compile(r"tests passed, \d+ tests failed out of (\d+)")


def show(text):
    return text.strip().replace("\n", " \u23ce ")


def sh(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, **kw)


# ---------------------------------------------------------------- configuration files

def read_labels(path):
    """labels.txt -> (folder -> [labels], cheap labels, never labels, skipped folders)."""
    folders, cheap, never, skip = {}, [], [], []
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            key, _, rest = line.partition(":")
            words = rest.split()
            if key == "cheap":
                cheap = words
            elif key == "never":
                never = words
            elif key == "skip":
                skip = words
            else:
                folders[key.strip().rstrip("/")] = words
    return folders, cheap, never, skip


def read_patterns(path):
    with open(path) as f:
        return [l.rstrip("\n") for l in f if l.strip() and not l.startswith("# ")]


def read_survivors(path):
    """survivors.txt -> {id: (class, reason)}; bad lines are errors."""
    triage = {}
    if not os.path.exists(path):
        return triage
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3 or parts[1] not in ("equivalent", "accepted", "fixed") \
                    or parts[0].count(":") != 2:
                sys.exit(f"{path}:{n}: expected 'file:line:hash equivalent|accepted|fixed reason'")
            triage[parts[0]] = (parts[1], parts[2])
    return triage


def find_triage(triage, mid):
    if mid in triage:
        return triage[mid]
    path, _, h = mid.split(":")
    for key, val in triage.items():  # the line moved: same file and mutated text
        kp, _, kh = key.split(":")
        if kp == path and kh == h:
            print(f"mutate: survivors.txt entry {key} matched {mid} (line moved)", file=sys.stderr)
            return val
    return None


# ---------------------------------------------------------------- mutants

def production_files(folders, skip):
    out = sh(["git", "ls-files", "--", *folders]).stdout.split()
    return sorted(p for p in out if p.endswith(EXTS) and not any(p.startswith(s + "/") for s in skip))


def folder_of(path, folders):
    best = None
    for f in folders:
        if path.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    return best


def plausible(original, mutant):
    """Drops the rule hits that are no mutant at all (whitespace alone) or cannot compile
    (a digit of a type name: std::int64_t -> std::int-1_t)."""
    if re.sub(r"\s", "", original) == re.sub(r"\s", "", mutant):
        return False
    digits = re.compile(r"\b[A-Za-z_]\w*\d\w*")
    return sorted(digits.findall(original)) == sorted(digits.findall(mutant))


def mutants_of(path, ignores, only_lines=None):
    from universalmutator import mutator  # the pinned venv (tools/mutate.sh)
    with open(os.path.join(ROOT, path)) as f:
        source = f.readlines()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its rule files and counts
        found = mutator.mutants_regexp(source, ruleFiles=RULES, ignorePatterns=list(ignores),
                                       ignoreStringOnly=True)
    result = []
    for lineno, text, _rule, _pair in found:
        if only_lines is not None and lineno not in only_lines:
            continue
        if not plausible(source[lineno - 1], text):
            continue
        h = hashlib.sha1(text.strip().encode()).hexdigest()[:10]
        result.append({"id": f"{path}:{lineno}:{h}", "file": path, "line": lineno,
                       "original": source[lineno - 1].rstrip("\n"), "mutant": text.rstrip("\n")})
    return result


def changed_lines(base, folders):
    """{path: set(line numbers)} of the lines added or changed since BASE (working tree)."""
    r = sh(["git", "diff", "-U0", "--no-color", "--no-ext-diff", base, "--", *folders])
    if r.returncode != 0:
        sys.exit(f"mutate: git diff {base} failed: {r.stderr.strip()}")
    lines, path = {}, None
    for l in r.stdout.splitlines():
        if l.startswith("+++ "):
            path = l[6:] if l.startswith("+++ b/") else None
        elif l.startswith("@@") and path:
            m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", l)
            start, count = int(m.group(1)), int(m.group(2) or "1")
            lines.setdefault(path, set()).update(range(start, start + count))
    return lines


def select(args, folders, skip, ignores):
    files = production_files(folders, skip)
    if args.diff:
        changed = changed_lines(args.diff, args.paths or folders)
        pool = [m for p in files if p in changed for m in mutants_of(p, ignores, changed[p])]
        random.Random(args.seed).shuffle(pool)  # a time box then samples the whole change
        return pool, len(pool)
    pool = [m for p in files for m in mutants_of(p, ignores)]
    n = min(args.sample, len(pool))
    return random.Random(args.seed).sample(pool, n), len(pool)


# ---------------------------------------------------------------- running

class Restorer:
    """Keeps the original of the file being mutated, in memory and on disk
    (OUT/restore.json, so a killed run is undone by the next one), and puts it back."""

    def __init__(self, out):
        self.journal = os.path.join(out, "restore.json")
        self.path = self.text = None

    def recover(self):
        if os.path.exists(self.journal):
            with open(self.journal) as f:
                j = json.load(f)
            with open(os.path.join(ROOT, j["path"]), "w") as f:
                f.write(j["text"])
            print(f"mutate: restored {j['path']} left mutated by an earlier run", file=sys.stderr)
            os.remove(self.journal)

    def write(self, mutant):
        full = os.path.join(ROOT, mutant["file"])
        with open(full) as f:
            self.text, self.path = f.read(), mutant["file"]
        with open(self.journal, "w") as f:
            json.dump({"path": self.path, "text": self.text}, f)
        lines = self.text.splitlines(keepends=True)
        lines[mutant["line"] - 1] = mutant["mutant"] + "\n"
        with open(full, "w") as f:
            f.write("".join(lines))

    def restore(self):
        if self.path is not None:
            with open(os.path.join(ROOT, self.path), "w") as f:
                f.write(self.text)
            self.path = self.text = None
            os.remove(self.journal)


def hold_tree_lock(root):
    """An exclusive lock on the tree (ROOT/build/.mutate.lock) for this process's life, or
    exit naming the holder: a second run on the same tree would write its mutants into the
    first one's sources, and its recovery would take the first one's journal for a
    crashed run's and put back a file under a mutant being tested."""
    os.makedirs(os.path.join(root, "build"), exist_ok=True)
    path = os.path.join(root, "build", ".mutate.lock")
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        sys.exit(f"mutate: another mutation run holds this tree ({path}: {f.read().strip() or 'pid unknown'})")
    f.truncate(0)
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


def run_killable(cmd, timeout):
    """(returncode or None on timeout, output); the whole process group is killed."""
    p = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise


def label_re(labels):
    return "^(" + "|".join(labels) + ")$"  # plain words: CMake regexes


def ctest_phases(args, first, cheap, never):
    """One ctest a label, the folder's labels first, in the order labels.txt lists them:
    ctest starts the costliest tests first and lets running tests finish after a failure,
    so a label run of its own keeps a unit-test kill from waiting for the zoo."""
    base = ["ctest", "--test-dir", args.build_dir, "--stop-on-failure", "--no-tests=ignore",
            "-j", str(args.jobs)]
    order = list(first) + [l for l in cheap if l not in first]
    return [base + ["-L", label_re([l]), "-LE", label_re(order[:i] + never)] for i, l in enumerate(order)]


QUICK_S = 10.0  # a test this quick under coverage runs in the first round


def covering_phases(args, first, cheap, never, names, tests_now, seconds=None):
    """The named tests, a ctest a label in ctest_phases' order, each picked by its ctest
    number (-I; not beside -L, since ctest then numbers the label's tests afresh). Given
    the tests' times under coverage (seconds), the quick ones of every label run first:
    ctest starts the costliest tests of a run first, so a unit test that kills would
    otherwise wait minutes behind the harness's long checks."""
    order = list(first) + [l for l in cheap if l not in first]
    base = ["ctest", "--test-dir", args.build_dir, "--stop-on-failure", "--no-tests=ignore", "-j", str(args.jobs)]
    by_label, left = [], set(names)
    for label in order:
        here = {n for n in left if label in tests_now[n]["labels"]}
        left -= here
        by_label.append(here)
    rounds = [by_label]
    if seconds is not None:
        quick = {n for n in names if seconds.get(n, QUICK_S + 1) <= QUICK_S}
        rounds = [[h & quick for h in by_label], [h - quick for h in by_label]]
    phases = []
    for groups in rounds:
        for here in groups:
            if here:
                phases.append(base + ["-I", "0,0,0," + ",".join(map(str, sorted(tests_now[n]["number"] for n in here)))])
    return phases


def load_coverage(args, cheap, never):
    """(map, tests of the mutate build, tests the map cannot vouch for); exits on a map
    of another tree."""
    path = os.path.join(args.coverage_dir, coverage.MAP_NAME)
    if not os.path.exists(path):
        sys.exit(f"mutate: --coverage: no map at {path}: cmake --preset mutate-cov, then "
                 f"tools/mutate.sh --build-coverage")
    cmap = coverage.Map(path)
    key = coverage.tree_key(ROOT)
    if cmap.key != key:
        sys.exit(f"mutate: --coverage: the map at {path} was measured on tree {cmap.key[:12]}, this tree is "
                 f"{key[:12]}: rebuild it (tools/mutate.sh --build-coverage) or run without --coverage")
    tests_now = coverage.ctest_tests(args.build_dir, cheap, never)
    unknown = cmap.unknown(tests_now)
    print(f"mutate: coverage map of tree {key[:12]}: {len(cmap.tests)} tests; {len(unknown)} of the "
          f"{len(tests_now)} tests here run for every covered mutant (not vouched for by the map)", flush=True)
    return cmap, tests_now, unknown


def choose_tests(args, m, folder_labels, cheap, never, cov):
    """(ctest phases, selection note) for a mutant; phases None: no test executes it."""
    if cov is None:
        return ctest_phases(args, folder_labels, cheap, never), "all"
    cmap, tests_now, unknown, compile_time = cov
    if m["file"] not in compile_time:
        with open(os.path.join(ROOT, m["file"])) as f:
            compile_time[m["file"]] = coverage.compile_time_lines(f.read())
    kind, what = cmap.select(m["file"], m["line"], compile_time[m["file"]])
    if kind == "all":
        return ctest_phases(args, folder_labels, cheap, never), f"all: {what}"
    names = (what & set(tests_now)) | unknown
    if not names:
        return None, "not covered"
    seconds = {n: t.get("seconds", QUICK_S + 1) for n, t in cmap.tests.items() if n not in unknown}
    return (covering_phases(args, folder_labels, cheap, never, names, tests_now, seconds),
            f"covering: {len(what & set(tests_now))} tests + {len(unknown)} unvouched")


def build(args):
    t = time.monotonic()
    rc, out = run_killable(["cmake", "--build", args.build_dir, "-j", str(args.jobs)], args.build_timeout)
    return rc == 0, time.monotonic() - t, out


def compiled_files(deps_text, build_dir):
    """The production files some object of the build depends on, from `ninja -t deps`
    (each object's depfile: its source and every header it included), relative to the
    root. A mutant of any other file (a backend the preset leaves out, kernels/ggml in the
    mutate presets) cannot reach a test: it is not_built, counted apart from the score."""
    files = set()
    for line in deps_text.splitlines():
        if line.startswith("    "):
            path = os.path.normpath(os.path.join(build_dir, line.strip()))
            files.add(os.path.relpath(path, ROOT))
    return files


def read_compiled_files(build_dir):
    """compiled_files of the build dir, or None when ninja cannot say (then no mutant is
    not_built)."""
    try:
        r = subprocess.run(["ninja", "-C", build_dir, "-t", "deps"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return compiled_files(r.stdout, build_dir) if r.returncode == 0 and r.stdout else None


def test(phases, timeout):
    """(status, first failing test or None, seconds); one deadline for every phase."""
    t0 = time.monotonic()
    for cmd in phases:
        left = timeout - (time.monotonic() - t0)
        rc, out = run_killable(cmd, max(left, 1))
        if rc is None:
            return "timeout", None, time.monotonic() - t0
        ran = RAN_RE.search(out)
        if "-I" in cmd and rc == 0 and (not ran or int(ran.group(1)) != cmd[-1].count(",") - 2):
            raise RuntimeError(f"ctest ran other tests than the {cmd[-1].count(',') - 2} chosen:\n{out[-2000:]}")
        if rc != 0:
            m = FAIL_RE.search(out)
            status = "timeout" if m and m.group(2) == "***Timeout" else "killed"
            return status, (m.group(1) if m else "(ctest rc %d)" % rc), time.monotonic() - t0
    return "survived", None, time.monotonic() - t0


def apply_triage(records, triage):
    """Marks each survivor with its survivors.txt entry (read afresh, so a resumed run's
    earlier survivors pick up the triage done since)."""
    for r in records:
        r.pop("triage", None), r.pop("triage_reason", None)
        hit = find_triage(triage, r["id"]) if r["status"] == "survived" else None
        if hit:
            r["triage"], r["triage_reason"] = hit


def not_covered(record):
    """No test the coverage map vouches for executes the mutated line (only the tests it
    cannot vouch for ran, if any)."""
    sel = record.get("selection") or ""
    return sel == "not covered" or sel.startswith("covering: 0 tests")


def summary(records, folders, triage_hits, not_run, total_pool, wall):
    """Per folder: the outcomes, how many survivors no test executes (not covered), are
    triaged and are equivalent; the score detected / (killed + survived + timeout), where
    detected adds to the killed the timeouts of a test past its own CTest timeout (a CI
    failure like any other; the tool's own deadline proves nothing), and the same without
    the equivalent survivors (no test could kill them); + fixed counts the survivors a new
    test kills since (triaged `fixed`, each checked by re-applying it) as detected."""
    keys = ["killed", "survived", "not_covered", "triaged", "equivalent", "timeout", "build_error", "not_built",
            "detected", "fixed"]
    rows = {}
    for r in records:
        row = rows.setdefault(r["folder"], dict.fromkeys(keys, 0))
        row[r["status"]] += 1
        row["detected"] += r["status"] == "killed" or (r["status"] == "timeout" and bool(r.get("killed_by")))
        row["fixed"] += r["status"] == "survived" and r.get("triage") == "fixed"
        if r["status"] == "survived":
            row["not_covered"] += not_covered(r)
            row["triaged"] += bool(r.get("triage"))
            row["equivalent"] += r.get("triage") == "equivalent"
    all_row = dict.fromkeys(keys, 0)
    for row in rows.values():
        for k in all_row:
            all_row[k] += row[k]
    lines = [f"{'folder':<14}{'killed':>8}{'survived':>10}{'(not cov.)':>12}{'(triaged)':>11}{'(equiv.)':>10}"
             f"{'timeout':>9}{'build err':>11}{'not built':>11}{'score':>8}{'non-equiv.':>12}{'+ fixed':>9}"]
    for name, row in sorted(rows.items()) + [("all", all_row)]:
        den = row["killed"] + row["survived"] + row["timeout"]
        score = f"{100.0 * row['detected'] / den:.0f}%" if den else "-"
        den2 = den - row["equivalent"]
        score2 = f"{100.0 * row['detected'] / den2:.0f}%" if den2 else "-"
        score3 = f"{100.0 * (row['detected'] + row['fixed']) / den2:.0f}%" if den2 else "-"
        lines.append(f"{name:<14}{row['killed']:>8}{row['survived']:>10}{row['not_covered']:>12}{row['triaged']:>11}"
                     f"{row['equivalent']:>10}{row['timeout']:>9}{row['build_error']:>11}{row['not_built']:>11}"
                     f"{score:>8}{score2:>12}{score3:>9}")
    costs = [r["build_s"] + r["test_s"] for r in records]
    if costs:
        lines.append(f"{len(records)} mutants run ({not_run} selected but not run, {total_pool} in the pool) "
                     f"(this session {wall:.0f} s); per mutant: mean {sum(costs) / len(costs):.1f} s "
                     f"(build {sum(r['build_s'] for r in records) / len(records):.1f} s, "
                     f"test {sum(r['test_s'] for r in records) / len(records):.1f} s)")
    surv = [r for r in records if r["status"] == "survived"]
    if surv:
        lines.append("survivors (add to tools/mutate/survivors.txt when triaged):")
        for r in surv:
            tag = f"[{r['triage']}] " if r.get("triage") else "[untriaged] "
            tag += "(not covered) " if not_covered(r) else ""
            lines.append(f"  {tag}{r['id']}  {show(r['original'])}  =>  {show(r['mutant'])}")
    return "\n".join(lines)


def build_coverage(args, folders, cheap, never):
    import coverage_run  # tools/mutate/coverage_run.py
    held = coverage.held_files(ROOT)
    if held:  # the build below would compile the mutant into the map
        sys.exit(f"mutate: a mutation run holds {', '.join(held)} mutated; build the map when none runs")
    if not os.path.exists(os.path.join(args.coverage_dir, "CTestTestfile.cmake")):
        sys.exit(f"mutate: {args.coverage_dir} is not configured: cmake --preset mutate-cov")
    rc, out = run_killable(["cmake", "--build", args.coverage_dir, "-j", str(args.jobs)], args.build_timeout)
    if rc != 0:
        sys.exit(f"mutate: {args.coverage_dir} does not build:\n{(out or '')[-3000:]}")
    return coverage_run.build_map(ROOT, args.coverage_dir, cheap, never, list(folders), args.jobs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--diff", metavar="BASE", help="mutants on the lines changed since BASE (git diff BASE)")
    mode.add_argument("--sample", type=int, metavar="N", help="a seeded random sample of N mutants of the tree")
    mode.add_argument("--recheck-fixed", metavar="REPORT_DIR",
                      help="run an earlier report's survivors triaged `fixed` again on this tree")
    mode.add_argument("--build-coverage", action="store_true",
                      help="measure the per-test coverage map in --coverage-dir (the mutate-cov preset) and stop")
    ap.add_argument("--paths", nargs="+", metavar="PATH",
                    help="diff mode: only the changes to these files or folders (one issue's files in a range "
                         "that holds others' too)")
    ap.add_argument("--seed", type=int, default=1, help="sample seed (diff mode: the order)")
    ap.add_argument("--time-box", type=float, metavar="MINUTES", help="start no mutant after this long")
    ap.add_argument("--list", action="store_true", help="print the selected mutants and stop")
    ap.add_argument("--resume", action="store_true",
                    help="go on with the run in --out: same selection, finished mutants kept, the rest run")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "mutate"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "mutate-report"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout-factor", type=float, default=3.0,
                    help="a mutant's tests time out after this many times the unmutated run (plus 30 s)")
    ap.add_argument("--test-timeout", type=float, metavar="SECONDS",
                    help="a mutant's test deadline; skips the unmutated test run that otherwise sets it")
    ap.add_argument("--build-timeout", type=float, default=1800)
    ap.add_argument("--coverage", action="store_true",
                    help="run a mutant's covering tests only (no test at all for a line none executes); "
                         "needs the map of this very tree (--build-coverage)")
    ap.add_argument("--coverage-dir", default=os.path.join(ROOT, "build", "mutate-cov"))
    ap.add_argument("--labels", default=os.path.join(DATA, "labels.txt"))
    ap.add_argument("--survivors", default=os.path.join(DATA, "survivors.txt"))
    args = ap.parse_args()

    if args.paths and not args.diff:
        ap.error("--paths narrows --diff only")
    for path in args.paths or []:
        if not os.path.exists(os.path.join(ROOT, path)):
            ap.error(f"--paths: {path} does not exist")
    folders, cheap, never, skip = read_labels(args.labels)
    ignores = read_patterns(os.path.join(DATA, "ignore.txt"))
    triage = read_survivors(args.survivors)
    if args.build_coverage:  # mutates nothing: leaves the report dir (maybe a running run's) alone
        return build_coverage(args, folders, cheap, never)
    if args.recheck_fixed:
        return recheck_fixed(args, folders, cheap, never, triage)
    os.makedirs(args.out, exist_ok=True)
    restorer = Restorer(args.out)
    if not args.list:  # --list writes nothing: it may run beside a run
        lock = hold_tree_lock(ROOT)  # noqa: F841  (held until the process exits)
        restorer.recover()

    chosen, pool = select(args, list(folders), skip, ignores)
    if args.diff:
        what = f"--diff {args.diff}" + (f" --paths {' '.join(args.paths)}" if args.paths else "")
    else:
        what = f"--sample {args.sample} --seed {args.seed}"
    print(f"mutate: {what}: {len(chosen)} mutants selected of {pool}", flush=True)
    if args.list:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head
        for m in chosen:
            print(f"{m['id']}  {show(m['original'])}  =>  {show(m['mutant'])}")
        return 0
    if not chosen:
        return 0
    if not os.path.exists(os.path.join(args.build_dir, "CTestTestfile.cmake")):
        sys.exit(f"mutate: {args.build_dir} is not configured: cmake --preset mutate")

    records, done, earlier = resume.start(args.out, resume.header(what, chosen), args.resume)
    if args.resume:
        print(f"mutate: resuming: {len(done)} of {len(chosen)} mutants already run", flush=True)
    start = time.monotonic()
    ok, build_s, out = build(args)
    if not ok:
        sys.exit(f"mutate: the unmutated tree does not build:\n{out[-3000:]}")
    if args.test_timeout:
        timeout = args.test_timeout
        print(f"mutate: baseline build {build_s:.0f} s; unmutated tests not run (--test-timeout)", flush=True)
    elif earlier and earlier.get("test_timeout"):
        timeout = earlier["test_timeout"]
        print(f"mutate: baseline build {build_s:.0f} s; the test deadline of the run resumed", flush=True)
    else:
        print(f"mutate: baseline build {build_s:.0f} s; running the cheap labels unmutated", flush=True)
        status, failing, base_s = test(ctest_phases(args, cheap, cheap, never), 24 * 3600)
        if status != "survived":
            sys.exit(f"mutate: the unmutated tree fails its tests ({failing}); fix that first")
        timeout = args.timeout_factor * base_s + 30
        resume.remember(args.out, "test_timeout", timeout)
        print(f"mutate: unmutated tests {base_s:.0f} s", flush=True)
    print(f"mutate: per-mutant test timeout {timeout:.0f} s", flush=True)

    cov = (*load_coverage(args, cheap, never), {}) if args.coverage else None
    compiled = read_compiled_files(args.build_dir)
    deadline = start + 60 * args.time_box if args.time_box is not None else None  # 0: resume, run nothing
    jsonl = open(os.path.join(args.out, "mutants.jsonl"), "a")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for i, m in enumerate(chosen):
            if i in done:
                continue
            if deadline is not None and time.monotonic() >= deadline:
                break
            folder = folder_of(m["file"], folders)
            phases, selection = choose_tests(args, m, folders[folder], cheap, never, cov)
            try:
                if compiled is not None and m["file"] not in compiled:
                    built, build_s, status, failing, test_s = False, 0.0, "not_built", None, 0.0
                else:
                    restorer.write(m)
                    built, build_s, _ = build(args)
                    if not built:
                        status, failing, test_s = "build_error", None, 0.0
                    elif phases is None:  # built, so it is a mutant; no test runs its line
                        status, failing, test_s = "survived", None, 0.0
                    else:
                        status, failing, test_s = test(phases, timeout)
            finally:
                restorer.restore()
            rec = dict(m, index=i, folder=folder, status=status, killed_by=failing, selection=selection,
                       build_s=round(build_s, 1), test_s=round(test_s, 1))
            records.append(rec)
            jsonl.write(json.dumps(rec) + "\n")
            jsonl.flush()
            shown = "survived (not covered)" if phases is None and built else status
            print(f"[{i + 1}/{len(chosen)}] {shown:<11} {m['id']}  build {build_s:.0f} s test {test_s:.0f} s"
                  + (f"  ({failing})" if failing else ""), flush=True)
    except KeyboardInterrupt:
        print("mutate: interrupted; the mutated file is restored", file=sys.stderr)
    finally:
        jsonl.close()
        restorer.restore() if restorer.path else None
        build(args)  # leave the build dir matching the tree (compiler-cache hits)
    apply_triage(records, triage)
    text = summary(records, folders, triage, len(chosen) - len(records), pool, time.monotonic() - start)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    untriaged = [r for r in records if r["status"] == "survived" and not r.get("triage")]
    return 1 if untriaged else 0


def recheck_fixed(args, folders, cheap, never, triage):
    """--recheck-fixed: each `fixed` survivor of the report, mutated again where its line is
    now, built and run against every cheap label (the folder's first); 1 unless all are
    killed (a `gone` one, whose line the fix rewrote, is not)."""
    todo = recheck.fixed_survivors(args.recheck_fixed, triage, find_triage)
    os.makedirs(args.out, exist_ok=True)
    lock = hold_tree_lock(ROOT)  # noqa: F841  (held until the process exits)
    restorer = Restorer(args.out)
    restorer.recover()
    ok, build_s, out = build(args)
    if not ok:
        sys.exit(f"mutate: the unmutated tree does not build:\n{out[-3000:]}")
    timeout = args.test_timeout or 3600
    results = []
    try:
        for r in todo:
            m = recheck.moved(r, ROOT)
            if m is None:
                results.append((r, "gone", None))
                print(f"gone      {r['id']}  (its original line is no longer in the file)", flush=True)
                continue
            folder = folder_of(m["file"], folders)
            try:
                restorer.write(m)
                built, build_s, _ = build(args)
                status, failing = ("build_error", None) if not built else \
                    test(ctest_phases(args, folders[folder], cheap, never), timeout)[:2]
            finally:
                restorer.restore()
            results.append((m, status, failing))
            print(f"{status:<9} {r['id']} (now line {m['line']})" + (f"  ({failing})" if failing else ""), flush=True)
    except KeyboardInterrupt:
        print("mutate: interrupted; the mutated file is restored", file=sys.stderr)
    finally:
        restorer.restore() if restorer.path else None
        build(args)
    text = "\n".join(recheck.summary(results))
    with open(os.path.join(args.out, "recheck.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if results and all(s == "killed" for _, s, _ in results) and len(results) == len(todo) else 1


if __name__ == "__main__":
    sys.exit(main())
