#!/usr/bin/env bash
# Runs etcd's own end-to-end suites (go.etcd.io/etcd/tests/v3 at the release pinned in
# go/tools/etcd-tests) against leasehold and etcd 3.7, side by side.
#
# etcd's e2e framework starts `BIN_DIR/etcd` as a process with etcd's flags and drives it through
# `BIN_DIR/etcdctl` and clientv3. Each target gets its own BIN_DIR: for leasehold, the leasehold
# binary named `etcd`; for etcd37, etcd 3.7 itself; both beside etcdctl and etcdutl 3.7. The test
# binaries are built once per wrapper content into the tools cache (scripts/lib/go-tools.sh).
#
# Every top-level test runs on its own (one panic cannot end the run), in its own process group
# (killed afterwards, so no stray member keeps a port), one after another (the framework picks
# fixed ports). Tests listed in docs/compat.md under "etcd's end-to-end tests not run" are not
# run on leasehold; the table says why.
#
#   scripts/etcd-e2e.sh [--suite common|e2e|all] [--targets "leasehold etcd37"] [--run REGEX]
#                       [--list FILE] [--retries N] [--report]
#
# --list FILE runs only the top-level tests FILE names, one a line (`#` starts a comment).
#
# --retries N runs a failed test again, up to N times (etcd's suites time some steps to the
# second); the table marks a test that passed only on a retry "pass*". --report runs nothing and
# prints the table from the targets' last results.
# LEASEHOLD_BIN picks the leasehold binary (default target/debug/leasehold, built if missing);
# LEASEHOLD_E2E_TEST_TIMEOUT bounds each top-level test (seconds, default 600).
# Logs and results go to target/etcd-e2e/TARGET/SUITE/. Exit status 1 when a test not excluded
# fails on leasehold.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

suites="common"
targets="leasehold etcd37"
run_re='.*'
retries=0
report_only=false
per_test_timeout=${LEASEHOLD_E2E_TEST_TIMEOUT:-600}
while [ $# -gt 0 ]; do
  case $1 in
    --suite) suites=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --run) run_re=$2; shift 2 ;;
    --list)
      names=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$2" | grep -v '^$' | paste -sd'|')
      [ -n "$names" ] || { echo "etcd-e2e.sh: $2 names no test" >&2; exit 2; }
      run_re="^($names)\$"
      shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    --report) report_only=true; shift ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "etcd-e2e.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$suites" = all ] && suites="common e2e"

source scripts/lib/go-tools.sh
find_go

leasehold_bin=${LEASEHOLD_BIN:-$root/target/debug/leasehold}
case "$report_only: $targets " in
  false:*" leasehold "*)
    if [ -z "${LEASEHOLD_BIN:-}" ]; then cargo build -q -p leasehold --bin leasehold; fi
    [ -x "$leasehold_bin" ] || { echo "etcd-e2e.sh: no leasehold binary at $leasehold_bin" >&2; exit 2; } ;;
esac

# etcd_tests_bin SUITE: prints the path of etcd's SUITE test binary (built with -tags e2e),
# building it once per wrapper content.
etcd_tests_bin() {
  local suite=$1 dir="$root/go/tools/etcd-tests" key out
  key=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-12)
  out="$tools_cache/etcd-tests-$key"
  if [ ! -x "$out/$suite.test" ]; then
    mkdir -p "$out"
    echo "building etcd's tests/$suite (go.etcd.io/etcd/tests/v3) into $out" >&2
    (cd "$dir" && go test -c -mod=readonly -tags e2e -o "$out/$suite.test.tmp" \
      "go.etcd.io/etcd/tests/v3/$suite") >&2
    mv "$out/$suite.test.tmp" "$out/$suite.test"
  fi
  echo "$out/$suite.test"
}

# The module's own files (fixtures: certificates the tests point etcd at) are read relative to
# the package directory, so each test binary runs there.
tests_module_dir() {
  # `go list` names no directory for a module not yet in the module cache (a fresh machine):
  # download it first.
  local dir
  dir=$(cd "$root/go/tools/etcd-tests" && go mod download go.etcd.io/etcd/tests/v3 &&
    go list -mod=readonly -m -f '{{.Dir}}' go.etcd.io/etcd/tests/v3)
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    echo "etcd-e2e.sh: go.etcd.io/etcd/tests/v3 is not in the module cache after its download" >&2
    exit 1
  fi
  echo "$dir"
}

# Tests not run on leasehold: the rows of docs/compat.md's table under the heading "etcd's
# end-to-end tests not run", `| TestName | reason |`.
excluded_reason() {
  awk -v name="$1" '
    /^## / { on = ($0 ~ /end-to-end tests not run/) }
    on && /^\| *Test/ { split($0, f, "|"); gsub(/^ +| +$/, "", f[2]); gsub(/^ +| +$/, "", f[3]);
      if (f[2] == name) { print f[3]; exit } }' "$root/docs/compat.md"
}

etcdctl=$(etcdctl37_bin)
etcd37=""
case " $targets " in *" etcd37 "*) etcd37=$(etcd37_bin) ;; esac
etcdutl=$(go_tool etcd-tests go.etcd.io/etcd/etcdutl/v3 etcdutl)

out_root="$root/target/etcd-e2e"
mkdir -p "$out_root"
# A writable copy of the module's files: some tests write into their working directory, and the
# module cache is read-only.
module_dir="$out_root/module"
if $report_only; then
  module_dir=$(tests_module_dir)
else
  rm -rf "$module_dir"
  module_src=$(tests_module_dir)
  cp -r "$module_src" "$module_dir"
  chmod -R u+w "$module_dir"
fi
bin_dir() {
  local target=$1 dir="$out_root/$1/bin"
  mkdir -p "$dir"
  case $target in
    leasehold) ln -sf "$leasehold_bin" "$dir/etcd" ;;
    etcd37) ln -sf "$etcd37" "$dir/etcd" ;;
    *) echo "etcd-e2e.sh: unknown target $target" >&2; exit 2 ;;
  esac
  ln -sf "$etcdctl" "$dir/etcdctl"
  ln -sf "$etcdutl" "$dir/etcdutl"
  echo "$dir"
}

failed_on_leasehold=0
for suite in $suites; do
  test_bin=$(etcd_tests_bin "$suite")
  mapfile -t tests < <(cd "$module_dir/$suite" && "$test_bin" -test.list "$run_re" | grep '^Test')
  echo "== tests/$suite: ${#tests[@]} top-level tests; targets: $targets" >&2
  for target in $targets; do
    $report_only && break
    dir=$(bin_dir "$target")
    logs="$out_root/$target/$suite"
    rm -rf "$logs" && mkdir -p "$logs"
    : >"$logs/results.tsv"
    for t in "${tests[@]}"; do
      reason=$(excluded_reason "$t")
      if [ "$target" = leasehold ] && [ -n "$reason" ]; then
        printf '%s\texcluded\t0\n' "$t" >>"$logs/results.tsv"
        continue
      fi
      started=$SECONDS
      try=0
      while :; do
        set +e
        # setsid: the test and every member it starts share one process group, killed after.
        (cd "$module_dir/$suite" && exec setsid timeout -k 10 "$per_test_timeout" "$test_bin" \
          -test.run "^${t}\$" -test.v -test.count 1 -test.timeout "$((per_test_timeout - 10))s" \
          -bin-dir "$dir") >"$logs/$t.log" 2>&1 &
        pid=$!
        wait "$pid"
        rc=$?
        set -e
        kill -9 -- "-$pid" 2>/dev/null || true
        if [ $rc -eq 0 ]; then
          if grep -q "^--- PASS: $t " "$logs/$t.log"; then verdict=pass; else verdict=skip; fi
          [ $try -gt 0 ] && [ $verdict = pass ] && verdict='pass*'
          break
        fi
        verdict=FAIL
        [ $try -lt "$retries" ] || break
        try=$((try + 1))
        mv "$logs/$t.log" "$logs/$t.try$try.log"
      done
      printf '%s\t%s\t%s\n' "$t" "$verdict" "$((SECONDS - started))" >>"$logs/results.tsv"
      printf '%-10s %-55s %-5s %4ss\n' "$target" "$t" "$verdict" "$((SECONDS - started))" >&2
      if [ "$target" = leasehold ] && [ "$verdict" = FAIL ]; then failed_on_leasehold=1; fi
    done
  done

  # The table: one row per test, one column per target.
  echo
  echo "tests/$suite (etcd tests module $(basename "$(tests_module_dir)"))"
  printf '%-58s' test
  for target in $targets; do printf ' %-9s' "$target"; done
  echo
  declare -A counts=()
  for t in "${tests[@]}"; do
    printf '%-58s' "$t"
    for target in $targets; do
      v=$(awk -F'\t' -v t="$t" '$1 == t { print $2 " " $3 "s" }' "$out_root/$target/$suite/results.tsv" 2>/dev/null)
      [ -n "$v" ] || v="-"
      printf ' %-9s' "${v%% *}"
      k=${v%% *}
      [ "$k" = 'pass*' ] && k=pass
      counts[$target.$k]=$((${counts[$target.$k]:-0} + 1))
    done
    reason=$(excluded_reason "$t")
    [ -n "$reason" ] && printf '  (%s)' "$reason"
    echo
  done
  for target in $targets; do
    printf '%s: %s passed (pass*: on a retry), %s failed, %s skipped, %s excluded, of %s\n' "$target" \
      "${counts[$target.pass]:-0}" "${counts[$target.FAIL]:-0}" "${counts[$target.skip]:-0}" \
      "${counts[$target.excluded]:-0}" "${#tests[@]}"
  done
  unset counts
done
exit $failed_on_leasehold
