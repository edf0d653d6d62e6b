"""Tests of the mutation tool's own logic (tools/mutate.py and tools/mutate/*.py) that
need neither universalmutator nor a build: resuming a run, the coverage map's answers,
the compile-time scan, the tree key and the test phases a selection gives.

  python3 -m unittest -v test_mutate      (from tools/)
"""
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "mutate"))
sys.path.insert(0, HERE)
import coverage  # noqa: E402
import coverage_run  # noqa: E402
import mutate  # noqa: E402
import recheck  # noqa: E402
import resume  # noqa: E402


def mutant(i, path="core/a.cc", line=3):
    return {"id": f"{path}:{line}:{i:010x}", "file": path, "line": line}


class Resume(unittest.TestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp()
        self.chosen = [mutant(i) for i in range(4)]
        self.head = resume.header("--sample 4 --seed 1", self.chosen)

    def write_records(self, *records, tail=""):
        with open(os.path.join(self.out, "mutants.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
            f.write(tail)

    def test_fresh_run_empties_the_report(self):
        self.write_records({"index": 0, "id": "x"})
        records, done, earlier = resume.start(self.out, self.head, resume=False)
        self.assertEqual((records, done, earlier), ([], set(), None))
        self.assertEqual(os.path.getsize(os.path.join(self.out, "mutants.jsonl")), 0)

    def test_resume_keeps_finished_mutants_and_drops_a_torn_last_line(self):
        resume.start(self.out, self.head, resume=False)
        self.write_records({"index": 0, "id": "a", "status": "killed"},
                           {"index": 2, "id": "c", "status": "survived"}, tail='{"index": 3, "id"')
        records, done, _ = resume.start(self.out, self.head, resume=True)
        self.assertEqual(done, {0, 2})
        self.assertEqual([r["id"] for r in records], ["a", "c"])
        with open(os.path.join(self.out, "mutants.jsonl")) as f:
            self.assertEqual(len(f.read().splitlines()), 2)

    def test_resume_refuses_another_selection(self):
        resume.start(self.out, self.head, resume=False)
        other = resume.header("--sample 4 --seed 1", list(reversed(self.chosen)))
        with self.assertRaises(SystemExit) as e:
            resume.start(self.out, other, resume=True)
        self.assertIn("another selection", str(e.exception))

    def test_resume_without_an_earlier_run_is_an_error(self):
        with self.assertRaises(SystemExit) as e:
            resume.start(self.out, self.head, resume=True)
        self.assertIn("no earlier run", str(e.exception))

    def test_a_torn_line_before_the_end_is_an_error(self):
        resume.start(self.out, self.head, resume=False)
        self.write_records(tail='{"index": 0\n{"index": 1, "id": "b"}\n')
        with self.assertRaises(SystemExit):
            resume.start(self.out, self.head, resume=True)

    def test_the_test_deadline_is_remembered(self):
        resume.start(self.out, self.head, resume=False)
        resume.remember(self.out, "test_timeout", 123.0)
        _, _, earlier = resume.start(self.out, self.head, resume=True)
        self.assertEqual(earlier["test_timeout"], 123.0)


class NotBuilt(unittest.TestCase):
    def test_compiled_files_are_every_objects_source_and_headers(self):
        build = os.path.join(mutate.ROOT, "build", "mutate")
        deps = ("core/CMakeFiles/kvlab_core.dir/error.cc.o: #deps 3, deps mtime 1 (VALID)\n"
                "    ../../core/error.cc\n    /usr/include/stdc-predef.h\n    ../../include/kvlab/error.h\n\n"
                "cache/CMakeFiles/kvlab_cache.dir/kv_cache.cc.o: #deps 1, deps mtime 1 (VALID)\n"
                "    ../../cache/kv_cache.cc\n")
        files = mutate.compiled_files(deps, build)
        self.assertIn("core/error.cc", files)
        self.assertIn("include/kvlab/error.h", files)
        self.assertIn("cache/kv_cache.cc", files)
        self.assertNotIn("kernels/ggml/rope.cc", files)

    def test_not_built_mutants_stay_out_of_the_score(self):
        recs = [dict(mutant(i), folder="kernels", status=s, build_s=1.0, test_s=0.0, original="a", mutant="b")
                for i, s in enumerate(["killed", "survived", "not_built", "not_built"])]
        rows = mutate.summary(recs, {"kernels": []}, {}, 0, 4, 0.0).splitlines()
        kernels = rows[1].split()
        self.assertEqual(kernels[0], "kernels")
        self.assertEqual(kernels[8], "2")      # not built
        self.assertEqual(kernels[9], "50%")    # 1 killed of killed + survived + timeout

    def test_a_test_past_its_ctest_timeout_is_detected_the_tools_deadline_is_not(self):
        recs = [dict(mutant(i), folder="golden", status="timeout", killed_by=k, build_s=1.0, test_s=600.0,
                     original="a", mutant="b") for i, k in enumerate(["golden.own_model", None])]
        golden = mutate.summary(recs, {"golden": []}, {}, 0, 2, 0.0).splitlines()[1].split()
        self.assertEqual(golden[6], "2")      # timeouts
        self.assertEqual(golden[9], "50%")    # the CTest timeout detected, the tool's deadline not

    def test_survivors_fixed_since_count_in_the_last_column_only(self):
        recs = [dict(mutant(i), folder="cache", status=s, build_s=1.0, test_s=1.0, original="a", mutant="b",
                     triage=t) for i, (s, t) in enumerate([("killed", None), ("survived", "fixed"),
                                                           ("survived", "equivalent"), ("survived", None)])]
        cache = mutate.summary(recs, {"cache": []}, {}, 0, 4, 0.0).splitlines()[1].split()
        self.assertEqual(cache[9:12], ["25%", "33%", "67%"])  # 1/4; 1/3 non-equivalent; (1+1)/3


class TreeLock(unittest.TestCase):
    def test_a_second_run_on_the_same_tree_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            held = mutate.hold_tree_lock(d)
            with self.assertRaises(SystemExit) as e:
                mutate.hold_tree_lock(d)
            self.assertIn("another mutation run holds this tree", str(e.exception.code))
            self.assertIn(f"pid {os.getpid()}", str(e.exception.code))
            held.close()  # the first run ends: the tree is free again
            mutate.hold_tree_lock(d).close()


class Recheck(unittest.TestCase):
    def test_the_nearest_line_with_the_same_text_is_taken(self):
        lines = ["a", "  x = 1;", "b", "c", "x = 1;  ", "d"]
        self.assertEqual(recheck.locate(lines, "x = 1;", 5), 5)
        self.assertEqual(recheck.locate(lines, "x = 1;", 1), 2)
        self.assertEqual(recheck.locate(lines, "x = 1;", 3), 2)  # a tie goes to the earlier
        self.assertIsNone(recheck.locate(lines, "x = 2;", 3))

    def test_only_survivors_triaged_fixed_are_taken_and_a_rewritten_line_is_gone(self):
        with tempfile.TemporaryDirectory() as d:
            recs = [dict(mutant(1), status="survived", original="x = 1;"),
                    dict(mutant(2), status="survived", original="y = 2;"),
                    dict(mutant(3), status="killed", original="z = 3;"),
                    dict(mutant(4), status="survived", original="w = 4;")]
            with open(os.path.join(d, "mutants.jsonl"), "w") as f:
                f.write("\n".join(json.dumps(r) for r in recs) + "\n")
            triage = {recs[0]["id"]: ("fixed", "T"), recs[1]["id"]: ("equivalent", "E"),
                      recs[2]["id"]: ("fixed", "T"), recs[3]["id"]: ("fixed", "T")}
            todo = recheck.fixed_survivors(d, triage, mutate.find_triage)
            self.assertEqual([r["id"] for r in todo], [recs[0]["id"], recs[3]["id"]])
            os.makedirs(os.path.join(d, "core"))
            with open(os.path.join(d, "core", "a.cc"), "w") as f:
                f.write("// moved\n\n\n\nx = 1;\n")
            self.assertEqual(recheck.moved(todo[0], d)["line"], 5)
            self.assertIsNone(recheck.moved(todo[1], d))  # the fix rewrote it
        text = recheck.summary([(recs[0], "killed", "T.A"), (recs[3], "gone", None)])
        self.assertIn("2 fixed survivors", text[0])
        self.assertIn("1 gone", text[0])
        self.assertIn("(T.A)", text[1])


class CompileTime(unittest.TestCase):
    def test_constexpr_function_body_and_variables(self):
        src = ("int f(int x) {\n"             # 1
               "  return x + 1;\n"            # 2
               "}\n"                          # 3
               "constexpr int g(int x) {\n"   # 4
               "  return x * 2;\n"            # 5
               "}\n"                          # 6
               "constexpr int k = g(3)\n"     # 7
               "    + 1;\n"                   # 8
               "int h(int y) {\n"             # 9
               "  if constexpr (true) {\n"    # 10
               "    return y;\n"              # 11
               "  }\n"                        # 12
               "}\n")
        self.assertEqual(coverage.compile_time_lines(src), {4, 5, 6, 7, 8})

    def test_braced_initializer_table(self):
        src = "static constexpr int t[] = {\n  1,\n  2,\n};\nint after;\n"
        self.assertEqual(coverage.compile_time_lines(src), {1, 2, 3, 4})


def a_map(tmp, lines, tests):
    path = os.path.join(tmp, "map.json")
    with open(path, "w") as f:
        json.dump({"key": "k", "build_dir": "/b", "lines": lines, "tests": tests}, f)
    return coverage.Map(path)


class Selection(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.mkdtemp()
        t = {"labels": ["unit"], "signature": "s"}
        self.map = a_map(tmp, {"core/a.cc": {"10": [5, [0]], "11": [0, [0]], "12": [3, [0, 1]], "13": [2, []]}},
                         {"A": dict(t, status="passed", functions=[0]),
                          "B": dict(t, status="passed", functions=[1]),
                          "C": dict(t, status="failed", functions=[]),
                          "D": dict(t, status="skipped", functions=[])})

    def test_a_line_no_test_executes_needs_no_test(self):
        self.assertEqual(self.map.select("core/a.cc", 11, set()), ("covering", set()))

    def test_tests_entering_a_spanning_function_are_chosen(self):
        self.assertEqual(self.map.select("core/a.cc", 10, set()), ("covering", {"A"}))
        self.assertEqual(self.map.select("core/a.cc", 12, set()), ("covering", {"A", "B"}))

    def test_lines_the_map_cannot_answer_run_everything(self):
        self.assertEqual(self.map.select("core/a.cc", 9, set())[0], "all")      # not executable
        self.assertEqual(self.map.select("core/b.cc", 10, set())[0], "all")     # file not mapped
        self.assertEqual(self.map.select("core/a.cc", 10, {10})[0], "all")      # compile time
        self.assertEqual(self.map.select("core/a.cc", 13, set())[0], "all")     # executed, no function

    def test_failed_missing_and_changed_tests_are_not_vouched_for(self):
        now = {n: {"signature": "s"} for n in "ABCDE"}
        now["B"] = {"signature": "other seed"}
        self.assertEqual(self.map.unknown(now), {"B", "C", "E"})


class Phases(unittest.TestCase):
    def test_selected_tests_run_by_label_in_order_with_their_numbers(self):
        args = types.SimpleNamespace(build_dir="/b", jobs=2)
        tests_now = {"u1": {"number": 4, "labels": ["unit"]}, "u2": {"number": 9, "labels": ["unit"]},
                     "z": {"number": 7, "labels": ["zoo"]}, "p": {"number": 2, "labels": ["property"]}}
        phases = mutate.covering_phases(args, ["zoo"], ["unit", "property", "zoo"], ["fuzz"], {"u2", "z"}, tests_now)
        self.assertEqual([p[p.index("-I") + 1] for p in phases], ["0,0,0,7", "0,0,0,9"])
        self.assertFalse(any("-L" in p for p in phases))  # ctest renumbers a label's tests


class ChooseTests(unittest.TestCase):
    """mutate.choose_tests over a map of core/a.cc (test_mutate writes a file of its own)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.path = os.path.relpath(os.path.join(self.tmp, "a.cc"), mutate.ROOT)
        with open(os.path.join(mutate.ROOT, self.path), "w") as f:
            f.write("int f(int x) {\n  return x + 1;\n}\nconstexpr int k = 2;\nint g() { return 0; }\n")
        t = {"labels": ["unit"], "signature": "s", "status": "passed"}
        cmap = a_map(self.tmp, {self.path: {"2": [4, [0]], "4": [1, [0]], "5": [0, [0]]}},
                     {"A": dict(t, functions=[0]), "B": dict(t, functions=[])})
        self.tests_now = {"A": {"number": 1, "labels": ["unit"]}, "B": {"number": 2, "labels": ["unit"]},
                          "Z": {"number": 3, "labels": ["zoo"]}}
        self.args = types.SimpleNamespace(build_dir="/b", jobs=2)
        self.cov = lambda unknown: (cmap, self.tests_now, unknown, {})

    def choose(self, line, unknown=frozenset()):
        m = {"file": self.path, "line": line}
        return mutate.choose_tests(self.args, m, ["unit"], ["unit", "zoo"], [], self.cov(set(unknown)))

    def test_an_unexecuted_line_runs_nothing_unless_a_test_is_unvouched(self):
        self.assertEqual(self.choose(5), (None, "not covered"))
        phases, note = self.choose(5, {"Z"})
        self.assertEqual([p[p.index("-I") + 1] for p in phases], ["0,0,0,3"])

    def test_a_covered_line_runs_its_tests(self):
        phases, note = self.choose(2)
        self.assertEqual([p[p.index("-I") + 1] for p in phases], ["0,0,0,1"])
        self.assertTrue(note.startswith("covering: 1 tests"))

    def test_quick_tests_of_every_label_run_before_slow_ones(self):
        args = types.SimpleNamespace(build_dir="/b", jobs=2)
        tests_now = {"slow_unit": {"number": 1, "labels": ["unit"]}, "quick_unit": {"number": 2, "labels": ["unit"]},
                     "quick_zoo": {"number": 3, "labels": ["zoo"]}, "unknown": {"number": 4, "labels": ["unit"]}}
        seconds = {"slow_unit": 300.0, "quick_unit": 0.5, "quick_zoo": 2.0}
        phases = mutate.covering_phases(args, ["unit"], ["unit", "zoo"], [], set(tests_now), tests_now, seconds)
        self.assertEqual([p[p.index("-I") + 1] for p in phases], ["0,0,0,2", "0,0,0,3", "0,0,0,1,4"])

    def test_an_unvouched_test_runs_once_in_its_first_label(self):
        self.tests_now["Z"]["labels"] = ["zoo", "unit"]
        phases, _ = self.choose(2, {"Z"})
        self.assertEqual([p[p.index("-I") + 1] for p in phases], ["0,0,0,1,3"])

    def test_compile_time_and_unmapped_lines_run_every_label(self):
        for line in (4, 1):
            phases, note = self.choose(line)
            self.assertTrue(note.startswith("all"), note)
            self.assertFalse(any("-I" in p for p in phases))
            self.assertEqual(len(phases), 2)


class ProfileParsing(unittest.TestCase):
    def test_entered_functions_keep_nonzero_entry_counts(self):
        shown = ("Counters:\n  _Z1fv:\n    Hash: 0x1\n    Counters: 2\n    Function count: 3\n"
                 "  a.cc:_ZL1gv:\n    Hash: 0x2\n    Counters: 1\n    Function count: 0\n"
                 "Instrumentation level: Front-end\nFunctions shown: 2\n")
        self.assertEqual(coverage_run.entered_functions(shown), {"_Z1fv"})

    def test_verdict_follows_ctest_properties(self):
        t = {"skip_rc": 77, "will_fail": False, "skip_re": [r"\[  SKIPPED \]"], "pass_re": [], "fail_re": ["BAD"]}
        self.assertEqual(coverage_run.verdict(t, 0, "ok"), "passed")
        self.assertEqual(coverage_run.verdict(t, 1, "ok"), "failed")
        self.assertEqual(coverage_run.verdict(t, 77, ""), "skipped")
        self.assertEqual(coverage_run.verdict(t, 0, "[  SKIPPED ] x"), "skipped")
        self.assertEqual(coverage_run.verdict(t, 0, "BAD thing"), "failed")
        self.assertEqual(coverage_run.verdict(dict(t, will_fail=True), 1, ""), "passed")


class TreeKey(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        subprocess.run(["git", "init", "-q", self.root], check=True)
        for path, text in {"core/a.cc": "int a;\n", "docs/x.txt": "doc\n", "tools/mutate/survivors.txt": "",
                           ".gitignore": "/build/\n"}.items():
            os.makedirs(os.path.join(self.root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(self.root, path), "w") as f:
                f.write(text)

    def edit(self, path, text):
        with open(os.path.join(self.root, path), "w") as f:
            f.write(text)

    def test_sources_change_the_key_docs_and_the_tool_do_not(self):
        k0 = coverage.tree_key(self.root)
        self.edit("docs/x.txt", "other\n")
        self.edit("tools/mutate/survivors.txt", "x equivalent y\n")
        self.assertEqual(coverage.tree_key(self.root), k0)
        self.edit("core/a.cc", "int b;\n")
        self.assertNotEqual(coverage.tree_key(self.root), k0)

    def test_a_file_held_mutated_counts_as_its_original(self):
        k0 = coverage.tree_key(self.root)
        os.makedirs(os.path.join(self.root, "build", "mutate-report"))
        self.edit("build/mutate-report/restore.json", json.dumps({"path": "core/a.cc", "text": "int a;\n"}))
        self.edit("core/a.cc", "int a = 1;\n")
        self.assertEqual(coverage.tree_key(self.root), k0)
        os.remove(os.path.join(self.root, "build/mutate-report/restore.json"))
        self.assertNotEqual(coverage.tree_key(self.root), k0)  # the same edit, not held


if __name__ == "__main__":
    unittest.main()
