#!/usr/bin/env bash
# Side-by-side benchmark: starts a throwaway etcd 3.4 (Debian's etcd-server), etcd 3.7 (built from
# the Go module proxy, scripts/lib/go-tools.sh) and leasehold on free loopback ports with data on
# the same disk, then runs the same `leasehold bench` workloads against each, alternating, and
# prints one JSON line per run plus the ratios per workload.
#
#   scripts/bench-compare.sh [rounds]      (default 3 rounds; needs `etcd` on PATH)
#
# Build first: cargo build --release -p leasehold
# LEASEHOLD_ARGS adds flags to leasehold's command line, e.g.
#   LEASEHOLD_ARGS='--snapshot-count 10000'
# TARGETS picks the servers (default "etcd etcd37 leasehold").
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=./target/release/leasehold
[ -x "$bin" ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 2; }
read -r -a targets <<<"${TARGETS:-etcd etcd37 leasehold}"

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
# shellcheck source=lib/go-tools.sh
. scripts/lib/go-tools.sh
# shellcheck source=lib/member.sh
. scripts/lib/member.sh
work=$(mktemp -d)
pids=()
# Each target's pid, for pause_others (lib/member.sh).
declare -A target_pids
cleanup() { stop_servers "${pids[@]}"; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

declare -A client_port
for target in "${targets[@]}"; do
  c=$(free_port); p=$(free_port); client_port[$target]=$c
  flags=(--name m --data-dir "$work/$target" --listen-client-urls "http://127.0.0.1:$c"
    --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p"
    --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "m=http://127.0.0.1:$p")
  run_server "$target" "$work/$target.log" "${flags[@]}"
  pids+=("$pid")
  target_pids[$target]=$pid
done
for target in "${targets[@]}"; do
  for _ in $(seq 1 100); do
    "$bin" bench range --endpoints "http://127.0.0.1:${client_port[$target]}" --total 1 >/dev/null 2>&1 && break
    sleep 0.1
  done
done

workloads=(
  "put --clients 1 --conns 1 --total 2000"
  "put --clients 64 --conns 8 --total 40000"
  "put --clients 64 --conns 8 --total 150000"
  "range --clients 64 --conns 8 --total 40000 --consistency l"
  "range --clients 64 --conns 8 --total 40000 --consistency s"
  "txn-put --clients 64 --conns 8 --total 20000 --txn-ops 4"
  "lease-grant --clients 64 --conns 8 --total 20000"
  "lease-keepalive --clients 64 --conns 8 --total 40000"
  "lease-keepalive --leases 5000 --streams 1 --conns 1 --duration 8"
  "lease-keepalive --leases 5000 --streams 1 --conns 1 --window 64 --duration 8"
  "lease-keepalive --leases 10000 --streams 4 --conns 4 --duration 8"
  "lease-keepalive --leases 5000 --streams 1 --conns 1 --ttl-secs 2 --duration 8"
  "lease-keepalive --leases 50000 --streams 1 --conns 1 --ttl-secs 6 --paced --duration 10"
  "lease-timetolive --clients 64 --conns 8 --total 40000 --keys-per-lease 10"
  "put-with-lease --clients 64 --conns 8 --total 20000 --keys-per-lease 10"
  "expiry-storm --clients 64 --conns 8 --total 10000 --ttl-secs 3"
  "expiry-lag --total 50 --ttl-secs 2 --gap-ms 100"
  "watch-latency --watchers 100 --conns 8 --total 200 --interval-ms 10"
  # kube-apiserver's patterns: a LIST of 10,000 1 KiB objects in pages of 500 (no watch cache),
  # and 100 watchers of one resource prefix.
  "list-paged --objects 10000 --page 500 --clients 1 --conns 1 --total 20"
  "list-paged --objects 10000 --page 500 --clients 8 --conns 8 --total 80"
  "watch-latency --watchers 100 --prefix --key /registry/pods/ --conns 8 --total 200 --interval-ms 10"
  # One writer's puts while a client reads 100,000 1 KiB objects whole, back to back (an
  # unpaged LIST): how long a big read holds writes back.
  "put-during-list --objects 100000 --readers 1 --conns 2 --duration 10"
  # kube-apiserver's periodic compaction: one writer's puts while 5 compactions, 2 s apart, drop
  # the history of 20,000 pod-sized (2.5 KB) objects written 3 times.
  "put-during-compact --objects 20000 --val-size 2500 --versions 3 --conns 2"
)
# Only some workloads, e.g. WORKLOADS="lease-|expiry" scripts/bench-compare.sh 1
if [ -n "${WORKLOADS:-}" ]; then
  filtered=()
  for w in "${workloads[@]}"; do [[ "$w" =~ $WORKLOADS ]] && filtered+=("$w"); done
  workloads=("${filtered[@]}")
fi
results="$work/results.jsonl"
for r in $(seq 1 "$rounds"); do
  for w in "${workloads[@]}"; do
    for target in "${targets[@]}"; do
      pause_others "$target"
      # shellcheck disable=SC2086
      line=$("$bin" bench $w --endpoints "http://127.0.0.1:${client_port[$target]}" -w json)
      resume_all
      echo "{\"round\":$r,\"target\":\"$target\",\"args\":\"$w\",\"result\":$line}" | tee -a "$results"
    done
  done
done
python3 scripts/lib/bench_table.py "$results" "workload"
