#!/usr/bin/env bash
# Side-by-side benchmark: starts a throwaway etcd (Debian's etcd-server) and leasehold on free
# loopback ports with data on the same disk, then runs the same `leasehold bench` workloads
# against each, alternating, and prints one JSON line per run plus the ratio per workload.
#
#   scripts/bench-compare.sh [rounds]      (default 3 rounds; needs `etcd` on PATH)
#
# Build first: cargo build --release -p leasehold
# LEASEHOLD_ARGS adds flags to leasehold's command line, e.g.
#   LEASEHOLD_ARGS='--snapshot-count 10000'
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=./target/release/leasehold
[ -x "$bin" ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 2; }

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

ec=$(free_port); ep=$(free_port); lc=$(free_port); lp=$(free_port)
etcd --name e --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$ec" \
  --advertise-client-urls "http://127.0.0.1:$ec" --listen-peer-urls "http://127.0.0.1:$ep" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ep" --initial-cluster "e=http://127.0.0.1:$ep" \
  >"$work/etcd.log" 2>&1 &
pids+=($!)
LEASEHOLD_LOG=warn "$bin" --name l --data-dir "$work/leasehold" --listen-client-urls "http://127.0.0.1:$lc" --listen-peer-urls "http://127.0.0.1:$lp" \
  --initial-advertise-peer-urls "http://127.0.0.1:$lp" --initial-cluster "l=http://127.0.0.1:$lp" \
  ${LEASEHOLD_ARGS:-} >"$work/leasehold.log" 2>&1 &
pids+=($!)
for port in "$ec" "$lc"; do
  for _ in $(seq 1 100); do
    "$bin" bench range --endpoints "http://127.0.0.1:$port" --total 1 >/dev/null 2>&1 && break
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
    for target in etcd leasehold; do
      port=$ec; [ "$target" = leasehold ] && port=$lc
      # shellcheck disable=SC2086
      line=$("$bin" bench $w --endpoints "http://127.0.0.1:$port" -w json)
      echo "{\"round\":$r,\"target\":\"$target\",\"args\":\"$w\",\"result\":$line}" | tee -a "$results"
    done
  done
done
python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| workload | etcd req/s (median) | leasehold req/s (median) | leasehold/etcd | etcd p99 ms | leasehold p99 ms | etcd leases lost | leasehold leases lost |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for args in dict.fromkeys(r["args"] for r in rows):
    def med(t, k): return statistics.median(r["result"][k] for r in rows if r["args"] == args and r["target"] == t)
    e, l = med("etcd", "throughput_per_s"), med("leasehold", "throughput_per_s")
    lost = lambda t: sum(r["result"].get("leases_lost", 0) for r in rows if r["args"] == args and r["target"] == t)
    print(f"| {args} | {e:.0f} | {l:.0f} | {l/e:.2f} | {med('etcd','p99_ms'):.2f} | {med('leasehold','p99_ms'):.2f} | {lost('etcd')} | {lost('leasehold')} |")
storms = [r for r in rows if r["result"]["workload"] == "expiry-storm"]
if storms:
    print("\n| expiry-storm | target | last delete after the last deadline (ms) | first delete after the first deadline (ms) | deletes/s | early deletes | all deleted |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in storms:
        x = r["result"]
        print(f"| round {r['round']} | {r['target']} | {x.get('last_delete_after_latest_deadline_ms') or float('nan'):.0f} | {x.get('first_delete_after_earliest_deadline_ms') or float('nan'):.0f} | {x.get('deletes_per_s', 0):.0f} | {x['early_deletes']} | {x['all_deleted']} |")
PY
