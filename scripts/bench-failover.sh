#!/usr/bin/env bash
# Failover, side by side: a 3-member etcd and a 3-member leasehold on free loopback ports, each
# with --election-timeout 1000; KILLS times (default 5) the leader is SIGKILLed and the time
# until a surviving member names a new leader is measured (polled every 20 ms with etcdctl
# endpoint status), then the killed member is restarted and the cluster left to settle.
# Prints every kill and the median and maximum per target.
#
#   scripts/bench-failover.sh [kills]     (needs `etcd` and `etcdctl` on PATH)
#
# Build first: cargo build --release -p leasehold
# LEASEHOLD_ARGS adds flags to leasehold's command line, e.g.
#   LEASEHOLD_ARGS='--snapshot-count 10000'
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-5}
bin=./target/release/leasehold
# shellcheck source=lib/require.sh
. scripts/lib/require.sh
require_release_and_etcd

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
# shellcheck source=lib/member.sh
. scripts/lib/member.sh
work=$(mktemp -d)
declare -A pid
# Only the script's own shell cleans up (not a subshell that inherited the trap).
main=$BASHPID
cleanup() {
  [ "$BASHPID" = "$main" ] || return 0
  for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

declare -A client peer cluster

# run <target> <i> <state>: starts member i.
run() {
  local target=$1 i=$2 state=$3
  local args=(--name "m$i" --data-dir "$work/$target-m$i" --election-timeout 1000 --heartbeat-interval 100
    --listen-client-urls "http://127.0.0.1:${client[$target$i]}" --advertise-client-urls "http://127.0.0.1:${client[$target$i]}"
    --listen-peer-urls "http://127.0.0.1:${peer[$target$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$target$i]}"
    --initial-cluster "${cluster[$target]}" --initial-cluster-token "$target-failover" --initial-cluster-state "$state")
  if [ "$target" = etcd ]; then
    etcd "${args[@]}" >>"$work/$target-m$i.log" 2>&1 &
  else
    # shellcheck disable=SC2086 # LEASEHOLD_ARGS is a list of flags
    LEASEHOLD_LOG=warn "$bin" "${args[@]}" ${LEASEHOLD_ARGS:-} >>"$work/$target-m$i.log" 2>&1 &
  fi
  pid[$target$i]=$!
}

# leader_of <target> <except>: the index of the member that leads, asked of every member but
# <except>; empty when none does. Bounded by etcdctl's own timeouts.
leader_of() {
  local target=$1 except=$2 eps=""
  for i in 0 1 2; do [ "$i" = "$except" ] || eps+="${eps:+,}127.0.0.1:${client[$target$i]}"; done
  local status
  status=$(etcdctl --endpoints "$eps" --dial-timeout 200ms --command-timeout 200ms endpoint status 2>/dev/null) || true
  local lines
  lines=$(echo "$status" | awk -F', ' '$5 == "true" {print $1}')
  for i in 0 1 2; do
    if echo "$lines" | grep -q "127.0.0.1:${client[$target$i]}$"; then echo "$i"; return; fi
  done
}

results="$work/results"
for target in etcd leasehold; do
  three_members "$target"
  for i in 0 1 2; do run "$target" "$i" new; done
  for _ in $(seq 1 150); do [ -n "$(leader_of "$target" -1)" ] && break; sleep 0.1; done
  for k in $(seq 1 "$kills"); do
    old=$(leader_of "$target" -1)
    [ -n "$old" ] || { echo "$target: no leader before kill $k" >&2; exit 1; }
    # Let the cluster settle (a member restarted by the last round has caught up).
    sleep 2
    old=$(leader_of "$target" -1)
    start=$(date +%s%N)
    kill -9 "${pid[$target$old]}"; wait "${pid[$target$old]}" 2>/dev/null || true
    new=""
    for _ in $(seq 1 500); do
      new=$(leader_of "$target" "$old")
      [ -n "$new" ] && break
      sleep 0.02
    done
    took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    [ -n "$new" ] || took_ms=-1
    echo "$target kill $k: leader m$old killed, m${new:-?} leads after ${took_ms} ms" | tee -a "$results"
    echo "$target $took_ms" >>"$results.ms"
    run "$target" "$old" existing
  done
  for i in 0 1 2; do kill "${pid[$target$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
done
python3 - "$results.ms" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
print("\n| target | kills | median ms | max ms |")
print("|---|---:|---:|---:|")
for t in dict.fromkeys(r[0] for r in rows):
    ms = [int(r[1]) for r in rows if r[0] == t]
    print(f"| {t} | {len(ms)} | {statistics.median(ms):.0f} | {max(ms)} |")
PY
