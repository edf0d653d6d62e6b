"""A mutation run's state on disk, so a killed or time-boxed run can go on (--resume).

OUT/run.json names the run (mode, seed, and a hash of the selected mutants' ids in their
order) and the test deadline the unmutated run set; OUT/mutants.jsonl holds a record a
finished mutant, each with its index in the selection. Resuming checks that the same
selection comes out of the tree and seed again, keeps the finished records and runs the
rest; a mutant cut off half-way has no record and runs again. A different selection (the
production files changed, or another seed) is refused: its records would score another
sample.
"""
import hashlib
import json
import os
import sys


def header(what, chosen):
    ids = "\n".join(m["id"] for m in chosen)
    return {"run": what, "mutants": len(chosen), "selection_sha1": hashlib.sha1(ids.encode()).hexdigest()}


def _paths(out):
    return os.path.join(out, "run.json"), os.path.join(out, "mutants.jsonl")


def read_records(path):
    """The records of mutants.jsonl; a torn last line (a run killed while writing) is
    dropped, a torn line elsewhere is an error."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [l for l in f.read().split("\n") if l.strip()]
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                print(f"mutate: {path}:{n}: dropping a torn last record (it runs again)", file=sys.stderr)
                break
            sys.exit(f"mutate: {path}:{n}: not a JSON record; move the report away and start afresh")
    return records


def start(out, head, resume):
    """(records already finished, their indices, earlier run.json or None). A fresh run
    writes run.json and empties mutants.jsonl; --resume checks the selection matches."""
    run_json, jsonl = _paths(out)
    if not resume:
        with open(run_json, "w") as f:
            json.dump(head, f, indent=1)
        open(jsonl, "w").close()
        return [], set(), None
    if not os.path.exists(run_json):
        sys.exit(f"mutate: --resume: no earlier run in {out} (no run.json); run without --resume")
    with open(run_json) as f:
        old = json.load(f)
    if old.get("run") != head["run"] or old.get("selection_sha1") != head["selection_sha1"]:
        sys.exit(f"mutate: --resume: {out} holds the run '{old.get('run')}' over another selection "
                 f"than '{head['run']}' gives now (the production files or the seed changed); "
                 f"run without --resume to start afresh")
    records = read_records(jsonl)
    with open(jsonl, "w") as f:  # rewrite without a torn line, then append
        f.writelines(json.dumps(r) + "\n" for r in records)
    return records, {r["index"] for r in records if "index" in r}, old


def remember(out, key, value):
    """Stores a figure of this run (the test deadline) in run.json for a resume."""
    run_json, _ = _paths(out)
    with open(run_json) as f:
        head = json.load(f)
    head[key] = value
    with open(run_json, "w") as f:
        json.dump(head, f, indent=1)
