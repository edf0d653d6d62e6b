#!/usr/bin/env bash
# The plugin tests' driver (CMakeLists.txt).
#   expect.sh error EXIT FRAGMENT COMMAND...   COMMAND exits EXIT and prints FRAGMENT
#   expect.sh caught KVLAB PLUGIN OPS          `kvlab check --tier ci` of the plugin fails
#       (exit 1) with a shrunk repro line naming --backend plugin:PLUGIN, and that line
#       fails again (exit 1) through `kvlab repro`
set -u
mode=$1; shift
case $mode in
  error)
    want=$1 fragment=$2; shift 2
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -n 20
    [ "$rc" -eq "$want" ] || { echo "FAIL: exit $rc, expected $want"; exit 1; }
    printf '%s\n' "$out" | grep -qF -- "$fragment" || { echo "FAIL: no '$fragment' in the output"; exit 1; }
    echo "OK: exit $rc, '$fragment'" ;;
  caught)
    kvlab=$1 plugin=$2 ops=$3
    out=$("$kvlab" check --tier ci --backend "plugin:$plugin" --op "$ops" --progress never 2>&1); rc=$?
    printf '%s\n' "$out" | grep -m1 -A8 '^FAILED'
    printf '%s\n' "$out" | tail -n 3
    [ "$rc" -eq 1 ] || { echo "FAIL: kvlab check exited $rc, expected 1 (the bug was not caught)"; exit 1; }
    shrunk=$(printf '%s\n' "$out" | grep -m1 '^  shrunk:') || { echo "FAIL: no shrunk repro"; exit 1; }
    prefix="  shrunk:   kvlab repro --backend plugin:$plugin '"
    case $shrunk in
      "$prefix"*) ;;
      *) echo "FAIL: the shrunk repro does not name --backend plugin:$plugin: $shrunk"; exit 1 ;;
    esac
    line=${shrunk#"$prefix"}; line=${line%%\'*}
    echo "re-running: kvlab repro --backend plugin:$plugin '$line'"
    "$kvlab" repro --backend "plugin:$plugin" "$line"; rc=$?
    [ "$rc" -eq 1 ] || { echo "FAIL: kvlab repro exited $rc, expected 1"; exit 1; }
    echo "OK: caught, shrunk to '$line', and the repro fails again" ;;
  *) echo "expect.sh: unknown mode $mode"; exit 2 ;;
esac
