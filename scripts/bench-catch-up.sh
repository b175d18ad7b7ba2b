#!/usr/bin/env bash
# A member that was down catches up, side by side: what it costs the leader's memory. For each
# target, a 3-member cluster on free loopback ports; WARM puts (default 2,000) of 2.5 KB values,
# one client, then a follower is SIGKILLed, BACKLOG more puts (default 4,500: below the 5,000
# entries both stores keep for a follower, so it catches up from the log, not a snapshot) are
# written without it, and it is restarted. The leader's RSS is sampled every 50 ms from before
# the kill until the follower's own (serializable) revision reaches the leader's.
#
#   scripts/bench-catch-up.sh [targets]     targets: default "etcd37 leasehold"; also
#                                            leasehold_before, a second leasehold binary
#                                            (LEASEHOLD_BEFORE_BIN)
#
# LEASEHOLD_BIN (default target/release/leasehold), LEASEHOLD_ARGS (extra leasehold flags); etcd
# 3.7.3 from go/tools/etcd, etcdctl Debian's. Servers start through scripts/lib/member.sh.
# Prints, per target: the leader's RSS before the kill, once the backlog is written,
# its peak during the catch-up and after it, and how long the catch-up took.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=${1:-etcd37 leasehold}
warm=${WARM:-2000}
backlog=${BACKLOG:-4500}
# shellcheck source=lib/require.sh
. scripts/lib/require.sh
# shellcheck source=lib/go-tools.sh
. scripts/lib/go-tools.sh
# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
# shellcheck source=lib/member.sh
. scripts/lib/member.sh
find_leasehold
bin=$lh_bin
command -v etcdctl >/dev/null || { echo "etcdctl not found (apt-get install etcd-client)" >&2; exit 2; }
find_go

work=$(mktemp -d)
declare -A pids client peer cluster
main=$BASHPID
cleanup() {
  [ "$BASHPID" = "$main" ] || return 0
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# run <target> <i> <state>: starts member i (run_server, member.sh).
run() {
  local target=$1 i=$2 state=$3
  run_server "$target" "$work/$target-m$i.log" --name "m$i" --data-dir "$work/$target-m$i" \
    --listen-client-urls "http://127.0.0.1:${client[$target$i]}" --advertise-client-urls "http://127.0.0.1:${client[$target$i]}" \
    --listen-peer-urls "http://127.0.0.1:${peer[$target$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$target$i]}" \
    --initial-cluster "${cluster[$target]}" --initial-cluster-token "$target-catch-up" --initial-cluster-state "$state"
  pids[$target$i]=$pid
}

# leader <target>: the index of the member that leads, or empty.
leader() {
  local target=$1 eps=""
  for i in 0 1 2; do eps+="${eps:+,}127.0.0.1:${client[$target$i]}"; done
  local lines
  lines=$(etcdctl --endpoints "$eps" --dial-timeout 300ms --command-timeout 300ms endpoint status 2>/dev/null | awk -F', ' '$5 == "true" {print $1}') || true
  for i in 0 1 2; do
    if echo "$lines" | grep -q "127.0.0.1:${client[$target$i]}$"; then echo "$i"; return; fi
  done
}

# revision <target> <i>: member i's own revision (a serializable read it answers alone).
revision() {
  etcdctl --endpoints "127.0.0.1:${client[$1$2]}" --dial-timeout 300ms --command-timeout 1s \
    get k --consistency=s -w json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])' 2>/dev/null || echo 0
}

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

puts() {
  "$bin" bench put --endpoints "http://127.0.0.1:${client[$1$2]}" --clients 1 --total "$3" \
    --val-size 2500 --key-space-size 100000 --sequential-keys -w json >/dev/null
}

results="$work/results"
for target in $targets; do
  three_members "$target"
  for i in 0 1 2; do run "$target" "$i" new; done
  lead=""
  for _ in $(seq 1 150); do lead=$(leader "$target"); [ -n "$lead" ] && break; sleep 0.1; done
  [ -n "$lead" ] || { echo "$target: no leader" >&2; exit 1; }
  down=$(( (lead + 1) % 3 ))
  puts "$target" "$lead" "$warm"
  sleep 2
  before=$(rss_kib "${pids[$target$lead]}")
  kill -9 "${pids[$target$down]}"; wait "${pids[$target$down]}" 2>/dev/null || true
  puts "$target" "$lead" "$backlog"
  sleep 2
  [ "$(leader "$target")" = "$lead" ] || { echo "$target: the leader changed during the backlog" >&2; exit 1; }
  written=$(rss_kib "${pids[$target$lead]}")
  goal=$(revision "$target" "$lead")
  peak=$written
  start=$(date +%s%N)
  run "$target" "$down" existing
  caught=""
  for _ in $(seq 1 1200); do
    r=$(rss_kib "${pids[$target$lead]}"); [ "$r" -gt "$peak" ] && peak=$r
    if [ "$(revision "$target" "$down")" -ge "$goal" ]; then caught=1; break; fi
    sleep 0.05
  done
  took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  [ -n "$caught" ] || took_ms=-1
  sleep 2
  after=$(rss_kib "${pids[$target$lead]}")
  echo "$target $before $written $peak $after $took_ms" >>"$results"
  for i in 0 1 2; do kill "${pids[$target$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
done
python3 - "$results" "$warm" "$backlog" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
print(f"\n{sys.argv[2]} puts, a follower down for {sys.argv[3]} more (2.5 KB values), then back")
print("| target | leader RSS before the kill | backlog written | peak in the catch-up | after | catch-up |")
print("|---|---:|---:|---:|---:|---:|")
for t, before, written, peak, after, ms in rows:
    mib = lambda k: f"{int(k) / 1024:.1f} MiB"
    took = "not caught up" if ms == "-1" else f"{int(ms) / 1000:.2f} s"
    print(f"| {t} | {mib(before)} | {mib(written)} | {mib(peak)} | {mib(after)} | {took} |")
PY
