#!/usr/bin/env python3
"""Per kernel × dtype × mode table of a `kvlab check --json` run (e.g. --backend mlx):
cases compared, passed, failed, known divergences, unimplemented, and the measured distance
of the compared outputs (max |err|/|ref|inf, NMSE, max ulps over the passed and known cases).

  kvlab check --backend mlx --tier ci --json mlx.jsonl; tools/conformance_table.py mlx.jsonl
"""
import collections
import json
import sys


def key_of(line):
    words = line.split()
    p = dict(w.split("=", 1) for w in words[1:])
    mode = p.get("mode") or p.get("kmode") and f"K {p.get('kmode')}{p.get('kbits')}/V {p.get('vmode')}{p.get('vbits')}" \
        or (f"{p['bits']}-bit" if "bits" in p else p.get("mask", ""))
    flavour = p.get("rounding") or p.get("flavour") or ""
    return words[0], p.get("dtype", "-"), mode, flavour


def main(path):
    rows = collections.defaultdict(lambda: {"n": 0, "pass": 0, "fail": 0, "known": 0, "unimpl": 0,
                                            "rel": 0.0, "nmse": 0.0, "ulps": 0})
    for line in open(path):
        r = json.loads(line)
        row = rows[key_of(r["case"])]
        row["n"] += 1
        status = r["status"]
        known = status == "SKIPPED" and r["reason"].startswith("known divergence")
        if status == "PASSED":
            row["pass"] += 1
        elif status in ("FAILED", "INVALID"):
            row["fail"] += 1
        elif known:
            row["known"] += 1
        else:
            row["unimpl"] += 1
        if status == "PASSED" or known:
            m = r["metrics"]
            row["rel"] = max(row["rel"], m.get("rel_err", 0))
            row["nmse"] = max(row["nmse"], m.get("nmse", 0))
            row["ulps"] = max(row["ulps"], int(m.get("max_ulps", 0)))
    print(f"{'op':18} {'dtype':5} {'mode':22} {'flavour':9} {'cases':>5} {'pass':>5} {'fail':>4} {'known':>5} "
          f"{'unimpl':>6} {'max rel':>9} {'max NMSE':>9} {'max ulps':>9}")
    for (op, dtype, mode, flavour), r in sorted(rows.items()):
        compared = r["pass"] + r["known"] + r["fail"]
        if compared == 0:
            continue
        print(f"{op:18} {dtype:5} {mode:22} {flavour:9} {compared:5} {r['pass']:5} {r['fail']:4} {r['known']:5} "
              f"{r['unimpl']:6} {r['rel']:9.3g} {r['nmse']:9.3g} {r['ulps']:9}")


if __name__ == "__main__":
    main(sys.argv[1])
