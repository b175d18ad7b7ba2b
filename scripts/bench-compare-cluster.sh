#!/usr/bin/env bash
# Side-by-side benchmark of 3-member clusters: starts a throwaway 3-member etcd 3.4 (Debian's
# etcd-server), etcd 3.7 (built from the Go module proxy, scripts/lib/go-tools.sh) and leasehold
# on free loopback ports (all data on the same disk), then runs the same `leasehold bench`
# workloads against each, alternating, and prints one JSON line per run plus the ratios per
# workload. TARGETS picks the servers (default "etcd etcd37 leasehold").
#
#   scripts/bench-compare-cluster.sh [rounds]   (default 1 round; needs `etcd` and `etcdctl`)
#
# Workloads name where the clients connect: `leader` (the current leader only), `all` (every
# member; followers forward), `followers` (the two followers only).
# Build first: cargo build --release -p leasehold
# LEASEHOLD_ARGS adds flags to leasehold's command line, e.g.
#   LEASEHOLD_ARGS='--snapshot-count 10000'
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1}
bin=./target/release/leasehold
# shellcheck source=lib/require.sh
. scripts/lib/require.sh
require_release_and_etcd

read -r -a targets <<<"${TARGETS:-etcd etcd37 leasehold}"

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
# shellcheck source=lib/go-tools.sh
. scripts/lib/go-tools.sh
# shellcheck source=lib/member.sh
. scripts/lib/member.sh
work=$(mktemp -d)
pids=()
# Each target's member pids, for pause_others (lib/member.sh).
declare -A target_pids
cleanup() { stop_servers "${pids[@]}"; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# start <etcd|etcd37|leasehold|leasehold_before>: three members; sets <target>_clients to their client URLs.
start() {
  local target=$1 cluster="" clients=() peers=()
  for i in 1 2 3; do clients+=("$(free_port)"); peers+=("$(free_port)"); done
  for i in 0 1 2; do cluster+="${cluster:+,}m$i=http://127.0.0.1:${peers[$i]}"; done
  for i in 0 1 2; do
    local args=(--name "m$i" --data-dir "$work/$target-m$i"
      --listen-client-urls "http://127.0.0.1:${clients[$i]}" --advertise-client-urls "http://127.0.0.1:${clients[$i]}"
      --listen-peer-urls "http://127.0.0.1:${peers[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peers[$i]}"
      --initial-cluster "$cluster" --initial-cluster-token "$target-bench")
    run_server "$target" "$work/$target-m$i.log" "${args[@]}"
    pids+=("$pid")
    target_pids[$target]+="$pid "
  done
  local urls=""
  for i in 0 1 2; do urls+="${urls:+,}http://127.0.0.1:${clients[$i]}"; done
  for _ in $(seq 1 100); do
    "$bin" bench range --endpoints "$urls" --total 3 >/dev/null 2>&1 && break
    sleep 0.2
  done
  printf -v "${target}_clients" '%s' "$urls"
}

# endpoints <urls> <leader|all|followers>
endpoints() {
  local urls=$1 which=$2
  [ "$which" = all ] && { echo "$urls"; return; }
  local out="" u
  for u in ${urls//,/ }; do
    local leader
    leader=$(ETCDCTL_API=3 etcdctl --endpoints="${u#http://}" endpoint status -w json |
      python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; print(int(s["leader"]==s["header"]["member_id"]))')
    if { [ "$which" = leader ] && [ "$leader" = 1 ]; } || { [ "$which" = followers ] && [ "$leader" = 0 ]; }; then
      out+="${out:+,}$u"
    fi
  done
  echo "$out"
}

for target in "${targets[@]}"; do start "$target"; done

workloads=(
  "leader|put --clients 1 --conns 1 --total 1000"
  "leader|put --clients 64 --conns 8 --total 20000"
  "all|put --clients 64 --conns 8 --total 20000"
  "all|range --clients 64 --conns 8 --total 20000 --consistency l"
  # Linearizable reads on followers only: each round asks the leader, and (since 2026-12-04) also
  # waits for the leader's heartbeat of that round.
  "followers|range --clients 64 --conns 8 --total 20000 --consistency l"
  "all|lease-grant --clients 64 --conns 8 --total 10000"
  "followers|lease-keepalive --clients 64 --conns 8 --total 20000"
  "all|lease-keepalive --leases 6000 --streams 3 --conns 3 --duration 8"
  "all|lease-keepalive --leases 6000 --streams 3 --conns 3 --window 64 --duration 8"
  "all|lease-keepalive --leases 3000 --streams 3 --conns 3 --ttl-secs 6 --paced --duration 10"
  "all|lease-keepalive --leases 40000 --streams 3 --conns 3 --ttl-secs 6 --paced --duration 10"
  "followers|lease-keepalive --leases 6000 --streams 2 --conns 2 --duration 8"
  "all|expiry-storm --clients 64 --conns 8 --total 10000 --ttl-secs 3"
  # One writer's puts on the leader while a client reads 300,000 1 KiB objects whole from it,
  # back to back: how long a big read holds the leader's writes (and its Raft thread) back.
  "leader|put-during-list --objects 300000 --readers 1 --conns 2 --duration 10"
  # Issue 45's own size, 100,000 objects, read from the leader and from the followers (each
  # follower's read asks the leader for a read index; the writer's puts go to a follower too).
  "leader|put-during-list --objects 100000 --readers 1 --conns 2 --duration 10"
  "followers|put-during-list --objects 100000 --readers 1 --conns 2 --duration 10"
  # The same with the reads paced at two a second (what etcd 3.7 serves back to back here), so
  # both servers serve the same reads: back to back, leasehold's faster reads take more CPU.
  "leader|put-during-list --objects 100000 --readers 1 --conns 2 --duration 10 --read-every-ms 500"
  "followers|put-during-list --objects 100000 --readers 1 --conns 2 --duration 10 --read-every-ms 500"
  # The same with 1,000,000 objects (about 1 GB read whole), while 1,000 leases of 5 s are kept
  # alive: whether a read that size costs an election or a kept lease.
  "leader|put-during-list --objects 1000000 --readers 1 --conns 2 --duration 30 --keepalive-leases 1000 --lease-ttl 5"
  # Linearizable reads of single 2.5 KB objects while others are updated, at fixed rates, from
  # every member: kube-apiserver's gets (and its reads of the current revision) beside its writes.
  "all|get-during-put --objects 5000 --val-size 2500 --writers 16 --put-rate 1000 --readers 16 --read-rate 500 --conns 3 --duration 20"
)
if [ -n "${WORKLOADS:-}" ]; then
  filtered=()
  for w in "${workloads[@]}"; do [[ "$w" =~ $WORKLOADS ]] && filtered+=("$w"); done
  workloads=("${filtered[@]}")
fi
results="$work/results.jsonl"
for r in $(seq 1 "$rounds"); do
  for entry in "${workloads[@]}"; do
    which=${entry%%|*} w=${entry#*|}
    for target in "${targets[@]}"; do
      urls_var="${target}_clients"
      pause_others "$target"
      eps=$(endpoints "${!urls_var}" "$which")
      # shellcheck disable=SC2086
      line=$("$bin" bench $w --endpoints "$eps" -w json)
      resume_all
      echo "{\"round\":$r,\"target\":\"$target\",\"args\":\"$which: $w\",\"result\":$line}" | tee -a "$results"
    done
  done
done
python3 scripts/lib/bench_table.py "$results" "3 members: clients → workload"
