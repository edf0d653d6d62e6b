"""Builds the per-test coverage map (tools/mutate.sh --build-coverage; coverage.py reads it).

Every test of the cheap labels in the mutate-cov build runs alone, niced, two at a time,
each with its own LLVM_PROFILE_FILE; per test, llvm-profdata lists the functions it
entered. One llvm-cov export of all the profiles merged then gives every executable line
of the production folders, its count, and the functions whose code regions span it.
"""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import coverage

# A test that entered one of these forked a child that leaves by _exit (the plugin
# isolation, harness/isolated_call.cc): the child writes no profile, so what it ran is
# missing from the map and the test is marked blind. The child runs the isolated body
# (a lambda in harness/plugin_backend.cc calling one plugin entry point) and the plugin:
# a blind test counts as covering every line of those files and of every file compiled
# into an instrumented plugin (CHILD_FILES and child_files()).
FORKING = ("run_isolated",)
CHILD_FILES = ("harness/isolated_call.cc", "harness/plugin_backend.cc")
IGNORED = r"-ignore-filename-regex=(^/usr/|/_deps/|/tests/|/property_tests/|/fuzz/|/examples/)"


def instrumented_objects(build_dir):
    """Executables and shared objects of the build that carry a coverage mapping."""
    found = []
    for d, _dirs, files in os.walk(build_dir):
        if "CMakeFiles" in d or "coverage-work" in d:
            continue
        for f in files:
            p = os.path.join(d, f)
            if not (os.access(p, os.X_OK) or f.endswith(".so")) or os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
                if b"__llvm_covmap" in fh.read():
                    found.append(p)
    return sorted(found)


def run_one(i, name, t, work):
    """Runs one test with its own profile dir: (name, status, seconds, entered functions)."""
    pdir = os.path.join(work, str(i))
    os.makedirs(pdir, exist_ok=True)
    env = dict(os.environ, LLVM_PROFILE_FILE=os.path.join(pdir, "%p.profraw"))
    env.update(e.split("=", 1) for e in t["env"] if "=" in e)
    t0 = time.monotonic()
    p = subprocess.Popen(t["command"], cwd=t["cwd"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=3 * float(t["timeout"]) + 60)
        status = verdict(t, p.returncode, out.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        status = "timeout"
    seconds = time.monotonic() - t0
    raws = [os.path.join(pdir, f) for f in os.listdir(pdir) if f.endswith(".profraw")]
    funcs = set()
    if raws:
        prof = pdir + ".profdata"
        subprocess.run(["llvm-profdata", "merge", "-sparse", "-o", prof, *raws], check=True, capture_output=True)
        shown = subprocess.run(["llvm-profdata", "show", "--all-functions", prof], check=True,
                               capture_output=True, text=True).stdout
        funcs = entered_functions(shown)
        shutil.rmtree(pdir)
    if status == "passed" and any(f in name for name in funcs for f in FORKING):
        status = "blind"
    return name, status, seconds, funcs


def verdict(t, rc, out):
    """passed / skipped / failed, as ctest would judge the test's properties."""
    if t["skip_rc"] is not None and rc == t["skip_rc"]:
        return "skipped"
    if any(re.search(r, out) for r in t.get("skip_re", [])):
        return "skipped"
    ok = (rc == 0) != t["will_fail"]
    if t.get("pass_re"):
        ok = any(re.search(r, out) for r in t["pass_re"])
    if any(re.search(r, out) for r in t.get("fail_re", [])):
        ok = False
    return "passed" if ok else "failed"


def entered_functions(shown):
    """Names of the functions with a non-zero entry count in `llvm-profdata show
    --all-functions` output (a sparse profile omits the others)."""
    funcs, name = set(), None
    for line in shown.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.endswith(":"):
            name = line[2:-1]
        elif name and line.strip().startswith("Function count:"):
            if int(line.split(":")[1]) > 0:
                funcs.add(name)
            name = None
    return funcs


def export_lines(build_dir, objects, profile, folders, root):
    """{file: {line: [count, [function names]]}} of the production folders' executable
    lines, from llvm-cov over every instrumented object."""
    args = ["llvm-cov", "export", "-instr-profile", profile, objects[0]]
    for o in objects[1:]:
        args += ["-object", o]
    # Not llvm-cov's SOURCES filter: it compares paths as recorded, and a file reached by a
    # relative -I path is recorded as <build dir>/../../<file> (every header, every
    # non-unity TU: kernels/simd), so it would drop them. Third-party and test code is
    # left out by name; relpath normalizes the rest.
    args.append(IGNORED)
    lcov = subprocess.run(args + ["-format=lcov", "-skip-functions"], check=True,
                          capture_output=True, text=True).stdout
    lines, path = {}, None
    for l in lcov.splitlines():
        if l.startswith("SF:"):
            rel = os.path.relpath(l[3:], root)
            path = rel if any(rel.startswith(f + "/") for f in folders) else None
        elif path and l.startswith("DA:"):
            n, count = l[3:].split(",")[:2]
            lines.setdefault(path, {})[n] = [int(count), set()]
    js = json.loads(subprocess.run(args + ["-format=text", "-skip-expansions"], check=True,
                                   capture_output=True, text=True).stdout)
    for data in js["data"]:
        for fn in data["functions"]:
            rel_files = [os.path.relpath(f, root) for f in fn["filenames"]]
            for r in fn["regions"]:
                ls, le, file_id, kind = r[0], r[2], r[5], r[7]
                per_file = lines.get(rel_files[file_id]) if kind in (0, 1) else None
                if per_file is None:
                    continue
                for n in range(ls, le + 1):
                    if str(n) in per_file:
                        per_file[str(n)][1].add(fn["name"])
    return lines


def child_files(objects, profile, folders, root):
    """The production files a forked plugin child can run: CHILD_FILES and the files
    compiled into the instrumented shared objects (the plugins)."""
    files = set(CHILD_FILES)
    for so in (o for o in objects if o.endswith(".so")):
        lcov = subprocess.run(["llvm-cov", "export", "-format=lcov", "-skip-functions", IGNORED, "-instr-profile", profile, so],
                              check=True, capture_output=True, text=True).stdout
        for l in lcov.splitlines():
            rel = os.path.relpath(l[3:], root) if l.startswith("SF:") else ""
            if any(rel.startswith(f + "/") for f in folders):
                files.add(rel)
    return sorted(files)


def build_map(root, build_dir, cheap, never, folders, jobs):
    key = coverage.tree_key(root)
    tests = coverage.ctest_tests(build_dir, cheap, never)
    work = os.path.join(build_dir, "coverage-work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    names = sorted(tests)
    print(f"mutate: coverage map of {len(names)} tests in {build_dir} (tree {key[:12]})", flush=True)
    results, t0 = {}, time.monotonic()
    parallel = [n for n in names if not tests[n]["serial"]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_one, names.index(n), n, tests[n], work) for n in parallel]
        for k, f in enumerate(concurrent.futures.as_completed(futures), 1):
            name, status, sec, funcs = f.result()
            results[name] = (status, sec, funcs)
            if status not in ("passed", "skipped") or k % 50 == 0:
                print(f"  [{k}/{len(names)}] {status:<8} {name} {sec:.1f} s", flush=True)
    for n in names:
        if tests[n]["serial"]:
            name, status, sec, funcs = run_one(names.index(n), n, tests[n], work)
            results[name] = (status, sec, funcs)
    profiles = [os.path.join(work, f) for f in os.listdir(work) if f.endswith(".profdata")]
    merged = os.path.join(work, "all.profdata")
    subprocess.run(["llvm-profdata", "merge", "-sparse", "-o", merged, *profiles], check=True)
    objects = instrumented_objects(build_dir)
    lines = export_lines(build_dir, objects, merged, folders, root)
    fids = {}
    for per_file in lines.values():
        for entry in per_file.values():
            entry[1] = sorted(fids.setdefault(f, len(fids)) for f in entry[1])
    out = {"key": key, "build_dir": build_dir, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "seconds": round(time.monotonic() - t0), "lines": lines, "tests": {},
           "child_files": child_files(objects, merged, folders, root)}
    for n in names:
        status, sec, funcs = results[n]
        out["tests"][n] = {"status": status, "seconds": round(sec, 1), "labels": tests[n]["labels"],
                           "signature": coverage.normalized(tests[n], build_dir),
                           "functions": sorted(fids[f] for f in funcs if f in fids)}
    path = os.path.join(build_dir, coverage.MAP_NAME)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    shutil.rmtree(work)
    bad = sorted(n for n in names if results[n][0] not in ("passed", "skipped"))
    blind = sorted(n for n in names if results[n][0] == "blind")
    bad = [n for n in bad if n not in blind]
    print(f"mutate: coverage map written to {path} in {out['seconds']} s; {len(bad)} tests failed or timed out "
          f"(run for every mutant): {' '.join(bad[:20])}; {len(blind)} blind (also run for the files a "
          f"plugin child can run)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit("run through tools/mutate.sh --build-coverage")
