#!/usr/bin/env bash
# MoveLeader, side by side: an N-member etcd and an N-member leasehold (default 5) on free
# loopback ports, each with --election-timeout 1000. As soon as a new cluster has a leader,
# `etcdctl move-leader` hands leadership to the next member, MOVES times (default 10) in a row,
# each move started the moment the previous one returned, so every move but the first comes
# within one second of an election (the previous transfer). Each move is timed from the start of
# etcdctl to its exit (etcdctl's own start-up included, the same for both), and the member that
# leads afterwards is checked. Prints every move and the median and maximum per target.
#
#   scripts/bench-move-leader.sh [members] [moves]   (needs `etcd` and `etcdctl` on PATH)
#
# Build first: cargo build --release -p leasehold
# LEASEHOLD_ARGS adds flags to leasehold's command line.
set -euo pipefail
cd "$(dirname "$0")/.."
members=${1:-5}
moves=${2:-10}
bin=./target/release/leasehold
# shellcheck source=lib/require.sh
. scripts/lib/require.sh
require_release_and_etcd

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
work=$(mktemp -d)
declare -A pid
main=$BASHPID
cleanup() {
  [ "$BASHPID" = "$main" ] || return 0
  for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

declare -A client peer
results="$work/results"
for target in etcd leasehold; do
  cluster=""
  for i in $(seq 0 $((members - 1))); do
    client[$target$i]=$(free_port); peer[$target$i]=$(free_port)
    cluster+="${cluster:+,}m$i=http://127.0.0.1:${peer[$target$i]}"
  done
  eps=""
  for i in $(seq 0 $((members - 1))); do
    eps+="${eps:+,}http://127.0.0.1:${client[$target$i]}"
    args=(--name "m$i" --data-dir "$work/$target-m$i" --election-timeout 1000 --heartbeat-interval 100
      --listen-client-urls "http://127.0.0.1:${client[$target$i]}" --advertise-client-urls "http://127.0.0.1:${client[$target$i]}"
      --listen-peer-urls "http://127.0.0.1:${peer[$target$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$target$i]}"
      --initial-cluster "$cluster" --initial-cluster-token "$target-move" --initial-cluster-state new)
    if [ "$target" = etcd ]; then
      etcd "${args[@]}" >>"$work/$target-m$i.log" 2>&1 &
    else
      # shellcheck disable=SC2086 # LEASEHOLD_ARGS is a list of flags
      LEASEHOLD_LOG=warn "$bin" "${args[@]}" ${LEASEHOLD_ARGS:-} >>"$work/$target-m$i.log" 2>&1 &
    fi
    pid[$target$i]=$!
  done
  # status: "<leader endpoint> <leader id> <id of every endpoint, in order>", once every member
  # answers and all name the same leader.
  status() {
    etcdctl --endpoints "$eps" --dial-timeout 300ms --command-timeout 500ms endpoint status -w json 2>/dev/null |
      python3 -c '
import json, sys
rows = json.load(sys.stdin)
leaders = {r["Status"].get("leader", 0) for r in rows}
if len(rows) != int(sys.argv[1]) or len(leaders) != 1 or 0 in leaders:
    sys.exit(1)
leader = leaders.pop()
ep = [r["Endpoint"] for r in rows if r["Status"]["header"]["member_id"] == leader]
if not ep:
    sys.exit(1)
print(ep[0], leader, *[r["Status"]["header"]["member_id"] for r in rows])
' "$members" || true
  }
  st=""
  for _ in $(seq 1 300); do st=$(status); [ -n "$st" ] && break; sleep 0.05; done
  [ -n "$st" ] || { echo "$target: no leader" >&2; exit 1; }
  read -r leader_ep leader_id ids <<<"$st"
  read -r -a id_of <<<"$ids"
  for m in $(seq 1 "$moves"); do
    # The next member after the leader, in endpoint order.
    at=0
    for i in "${!id_of[@]}"; do [ "${id_of[$i]}" = "$leader_id" ] && at=$i; done
    to=${id_of[$(( (at + 1) % members ))]}
    start=$(date +%s%N)
    out=$(etcdctl --endpoints "$leader_ep" --command-timeout 10s move-leader "$(printf '%x' "$to")" 2>&1) || true
    took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    st=""
    for _ in $(seq 1 100); do st=$(status); [ -n "$st" ] && break; sleep 0.02; done
    read -r leader_ep leader_id _ <<<"$st"
    if [ "$leader_id" != "$to" ]; then
      echo "$target move $m: to $(printf '%x' "$to") failed after ${took_ms} ms: $out" | tee -a "$results"
      took_ms=-1
    else
      echo "$target move $m: to $(printf '%x' "$to") in ${took_ms} ms" | tee -a "$results"
    fi
    echo "$target $took_ms" >>"$results.ms"
  done
  for i in $(seq 0 $((members - 1))); do kill "${pid[$target$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
done
python3 - "$results.ms" "$members" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
print(f"\n{sys.argv[2]} members")
print("| target | moves | failed | median ms | max ms |")
print("|---|---:|---:|---:|---:|")
for t in dict.fromkeys(r[0] for r in rows):
    ms = [int(r[1]) for r in rows if r[0] == t]
    ok = [m for m in ms if m >= 0]
    med = f"{statistics.median(ok):.0f}" if ok else "-"
    mx = max(ok) if ok else "-"
    print(f"| {t} | {len(ms)} | {len(ms) - len(ok)} | {med} | {mx} |")
PY
