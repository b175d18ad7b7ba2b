#!/usr/bin/env bash
# Side-by-side benchmark of 3-member clusters: starts a throwaway 3-member etcd (Debian's
# etcd-server) and a 3-member leasehold on free loopback ports (all data on the same disk),
# then runs the same `leasehold bench` workloads against each, alternating, and prints one JSON
# line per run plus the ratio per workload.
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

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# start <etcd|leasehold>: three members; sets <target>_clients to their client URLs.
start() {
  local target=$1 cluster="" clients=() peers=()
  for i in 1 2 3; do clients+=("$(free_port)"); peers+=("$(free_port)"); done
  for i in 0 1 2; do cluster+="${cluster:+,}m$i=http://127.0.0.1:${peers[$i]}"; done
  for i in 0 1 2; do
    local args=(--name "m$i" --data-dir "$work/$target-m$i"
      --listen-client-urls "http://127.0.0.1:${clients[$i]}" --advertise-client-urls "http://127.0.0.1:${clients[$i]}"
      --listen-peer-urls "http://127.0.0.1:${peers[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peers[$i]}"
      --initial-cluster "$cluster" --initial-cluster-token "$target-bench")
    if [ "$target" = etcd ]; then
      etcd "${args[@]}" >"$work/$target-m$i.log" 2>&1 &
    else
      # shellcheck disable=SC2086 # LEASEHOLD_ARGS is a list of flags
      LEASEHOLD_LOG=warn "$bin" "${args[@]}" ${LEASEHOLD_ARGS:-} >"$work/$target-m$i.log" 2>&1 &
    fi
    pids+=($!)
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

start etcd
start leasehold

workloads=(
  "leader|put --clients 1 --conns 1 --total 1000"
  "leader|put --clients 64 --conns 8 --total 20000"
  "all|put --clients 64 --conns 8 --total 20000"
  "all|range --clients 64 --conns 8 --total 20000 --consistency l"
  "all|lease-grant --clients 64 --conns 8 --total 10000"
  "followers|lease-keepalive --clients 64 --conns 8 --total 20000"
  "all|lease-keepalive --leases 6000 --streams 3 --conns 3 --duration 8"
  "all|lease-keepalive --leases 6000 --streams 3 --conns 3 --window 64 --duration 8"
  "all|lease-keepalive --leases 3000 --streams 3 --conns 3 --ttl-secs 6 --paced --duration 10"
  "all|lease-keepalive --leases 40000 --streams 3 --conns 3 --ttl-secs 6 --paced --duration 10"
  "followers|lease-keepalive --leases 6000 --streams 2 --conns 2 --duration 8"
  "all|expiry-storm --clients 64 --conns 8 --total 10000 --ttl-secs 3"
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
    for target in etcd leasehold; do
      urls=$etcd_clients; [ "$target" = leasehold ] && urls=$leasehold_clients
      eps=$(endpoints "$urls" "$which")
      # shellcheck disable=SC2086
      line=$("$bin" bench $w --endpoints "$eps" -w json)
      echo "{\"round\":$r,\"target\":\"$target\",\"args\":\"$which: $w\",\"result\":$line}" | tee -a "$results"
    done
  done
done
python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| 3 members: clients → workload | etcd req/s (median) | leasehold req/s (median) | leasehold/etcd | etcd p99 ms | leasehold p99 ms | etcd leases lost | leasehold leases lost |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for args in dict.fromkeys(r["args"] for r in rows):
    def med(t, k): return statistics.median(r["result"][k] for r in rows if r["args"] == args and r["target"] == t)
    e, l = med("etcd", "throughput_per_s"), med("leasehold", "throughput_per_s")
    lost = lambda t: sum(r["result"].get("leases_lost", 0) for r in rows if r["args"] == args and r["target"] == t)
    print(f"| {args} | {e:.0f} | {l:.0f} | {l/e:.2f} | {med('etcd','p99_ms'):.2f} | {med('leasehold','p99_ms'):.2f} | {lost('etcd')} | {lost('leasehold')} |")
storms = [r for r in rows if r["result"]["workload"] == "expiry-storm"]
if storms:
    print("\n| expiry-storm | target | lag p50 ms | lag p99 ms | last delete after the last deadline (ms) | early deletes | all deleted |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in storms:
        x = r["result"]
        print(f"| round {r['round']} | {r['target']} | {x.get('p50_ms', float('nan')):.1f} | {x.get('p99_ms', float('nan')):.1f} | {x.get('last_delete_after_latest_deadline_ms') or float('nan'):.0f} | {x['early_deletes']} | {x['all_deleted']} |")
PY
