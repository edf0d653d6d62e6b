#!/usr/bin/env bash
# Regenerates the checked-in seed corpora (fuzz/corpus/<target>/) from the harness's
# case files, the state-file seed writer and `kvlab vectors write`. Run from the
# repository root after building the fuzz preset's fuzz_gen_state_seeds target and a
# kvlab binary (KVLAB, default build/ci/tools/kvlab):
#   cmake --build --preset fuzz --target fuzz_gen_state_seeds && bash fuzz/make_corpus.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=fuzz/corpus
rm -rf "$out" && mkdir -p "$out"/{problem_line,case_file,run_reference,state_file,vectors_file}

# problem_line: every line of the smoke and ci case files (product syntax included),
# one file each, comments dropped.
for f in harness/cases/*/smoke harness/cases/*/ci; do
  op=$(basename "$(dirname "$f")") role=$(basename "$f") n=0
  sed 's/#.*//' "$f" | grep -v '^[[:space:]]*$' | while IFS= read -r line; do
    n=$((n + 1))
    printf '%s' "$line" >"$out/problem_line/$op-$role-$n"
  done
done

# case_file: the smoke files whole (comments, blank lines and products), plus each
# op's edge-shape file.
for f in harness/cases/*/smoke harness/cases/*/shapes_edges; do
  cp "$f" "$out/case_file/$(basename "$(dirname "$f")")-$(basename "$f")"
done

# run_reference: the smoke lines expanded to single problems (parse_problem takes no
# products): small shapes the reference runs in milliseconds.
python3 - "$out/run_reference" harness/cases/*/smoke <<'PY'
import itertools, os, re, sys
out, files = sys.argv[1], sys.argv[2:]
for path in files:
    op_dir = os.path.basename(os.path.dirname(path))
    n = 0
    for line in open(path):
        toks = re.sub("#.*", "", line).split()
        if not toks:
            continue
        lists = [[(k, v) for v in vs.split(",")] for k, vs in (t.split("=", 1) for t in toks[1:])]
        for combo in itertools.product(*lists):
            n += 1
            with open(os.path.join(out, f"{op_dir}-{n}"), "w") as f:
                f.write(" ".join([toks[0]] + [f"{k}={v}" for k, v in combo]))
PY

# state_file: one small file per cache class, all of them as one model, no layers.
build/fuzz/fuzz/fuzz_gen_state_seeds "$out/state_file"

# vectors_file: kvlab's own vectors of tiny problems (a few hundred bytes of tensors
# each), one op per file and one file mixing ops and dtypes.
kvlab=${KVLAB:-build/ci/tools/kvlab}
cases=$(mktemp)
trap 'rm -f "$cases"' EXIT
vectors_seed() {  # name, then problem lines
  local name=$1
  shift
  printf '%s\n' "$@" >"$cases"
  "$kvlab" vectors write --cases "$cases" -o "$out/vectors_file/$name" >/dev/null
}
vectors_seed rope 'rope B=1 H=1 T=2 D=4 dims=4'
vectors_seed sdpa 'sdpa B=1 Hq=1 Hkv=1 Lq=1 Lk=2 Dk=4 Dv=4'
vectors_seed affine_quantize 'affine_quantize B=1 H=1 T=1 D=32 group=32'
vectors_seed kv_scatter 'kv_scatter B=1 H=1 S=1 L=2 W=4'
vectors_seed mixed 'rope B=1 H=1 T=2 D=4 dims=4 dtype=f16' 'kv_scatter B=1 H=1 S=1 L=2 W=4 dtype=bf16'
du -sb "$out"/*
