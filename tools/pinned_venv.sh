# Sourced by the setup scripts of the hash-pinned helper venvs (tools/ggml, tools/mutate).
# pinned_venv VENV LOG REQ...: builds VENV from the requirements files, each installed with
# --no-deps --require-hashes, and keeps a VENV whose stamp matches their text. Returns 0
# with VENV ready, or 1 with the reason in $pinned_venv_reason (VENV removed, LOG kept).
pinned_venv() {
  local venv=$1 log=$2 req python stamp
  shift 2
  stamp=$(cat "$@")
  if [[ -f "$venv/.kvlab-requirements" ]] && [[ "$(cat "$venv/.kvlab-requirements")" == "$stamp" ]]; then
    return 0
  fi
  python=${KVLAB_PYTHON:-python3}
  if ! command -v "$python" >/dev/null; then
    pinned_venv_reason="no $python on PATH"
    return 1
  fi
  rm -rf "$venv"
  if ! "$python" -m venv "$venv" >"$log" 2>&1; then
    pinned_venv_reason="'$python -m venv' failed (see $log)"
    return 1
  fi
  for req in "$@"; do
    if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-input --no-deps --require-hashes \
        -r "$req" >>"$log" 2>&1; then
      pinned_venv_reason="pip install -r $req failed: $(grep -m1 -E 'ERROR|Could not|Failed|THESE PACKAGES' "$log" |
        cut -c1-200)"
      rm -rf "$venv"
      return 1
    fi
  done
  printf '%s' "$stamp" >"$venv/.kvlab-requirements"
}
