#!/usr/bin/env bash
# The plugin tests' driver (CMakeLists.txt).
#   expect.sh error EXIT FRAGMENT COMMAND...   COMMAND exits EXIT and prints FRAGMENT
#   expect.sh caught KVLAB PLUGIN OPS          `kvlab check --tier ci` of the plugin fails
#       (exit 1) with a shrunk repro line naming --backend plugin:PLUGIN, and that line
#       fails again (exit 1) through `kvlab repro`
#   expect.sh isolated KVLAB PLUGIN JSON JUNIT   the crashing twin over rope and kv_gather:
#       its crashes and hangs are FAILED cases and the run goes on (see the mode below)
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
  isolated)
    # A plugin that crashes in one op and hangs in another (the crashing twin): each such
    # case FAILED with the signal or the time limit and a repro line, every other case
    # judged, and both reports written (docs/plugins.md).
    kvlab=$1 plugin=$2 json=$3 junit=$4
    rm -f "$json" "$junit"
    out=$("$kvlab" check --tier ci --backend "plugin:$plugin,timeout=1" --op rope,kv_gather --progress never \
          --json "$json" --junit "$junit" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -m2 -A2 '^FAILED'
    printf '%s\n' "$out" | tail -n 4
    [ "$rc" -eq 1 ] || { echo "FAIL: kvlab check exited $rc, expected 1"; exit 1; }
    for want in "op rope crashed: " "op kv_gather did not return within 1 s" \
                "repro:    kvlab repro --backend plugin:$plugin,timeout=1 'rope " \
                "repro:    kvlab repro --backend plugin:$plugin,timeout=1 'kv_gather "; do
      printf '%s\n' "$out" | grep -qF -- "$want" || { echo "FAIL: no '$want' in the output"; exit 1; }
    done
    summary=$(printf '%s\n' "$out" | tail -n 1)
    case $summary in
      *" 0 invalid, "*) ;;
      *) echo "FAIL: cases were not judged: $summary"; exit 1 ;;
    esac
    passed=$(printf '%s\n' "$summary" | sed -n 's/.* \([0-9][0-9]*\) passed.*/\1/p')
    [ "${passed:-0}" -gt 100 ] || { echo "FAIL: only ${passed:-0} cases passed around the crashes"; exit 1; }
    failed=$(grep -c '"status":"FAILED"' "$json")
    [ "$failed" -ge 2 ] && grep -q 'did not return within' "$json" && grep -q 'crashed: ' "$json" \
      || { echo "FAIL: the JSON report lacks the crashed and hung cases"; exit 1; }
    [ "$(grep -c '<failure' "$junit")" -eq "$failed" ] || { echo "FAIL: JUnit and JSON disagree on the failures"; exit 1; }
    echo "OK: $failed cases FAILED (crash and hang) with repro lines, $passed passed, reports written" ;;
  *) echo "expect.sh: unknown mode $mode"; exit 2 ;;
esac
