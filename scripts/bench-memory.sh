#!/usr/bin/env bash
# Memory and restart, etcd and leasehold side by side: for each, a fresh single member on loopback
# ports with data on the same disk, then
#   1. `leasehold bench lease-memory`: N leases (TTL 3,600 s), RSS; one ~47-byte key with a 16-byte
#      value attached to each, RSS again (bytes per idle lease, bytes per attached key);
#   2. SIGTERM, and the time until the process has exited;
#   3. a restart, and the time from exec until a linearizable read answers;
#   4. the remaining TTL of three sampled leases before and after the restart (never more after:
#      no fresh TTL), and the number of keys (nothing lost);
# then, on another fresh member each, what history costs: 100,000 puts of 1 KiB values over
# 1,000 keys (100,000 revisions kept), RSS; a compaction to the current revision, RSS again.
# Prints one JSON line per target and part, then tables.
#
#   scripts/bench-memory.sh [leases]      (default 1000000)
#
# TARGETS picks the servers (default "etcd37 leasehold"; the first is the baseline of every
# ratio), e.g. TARGETS="etcd37 leasehold_before leasehold" LEASEHOLD_BEFORE_BIN=/tmp/old.
#
# Build first: cargo build --release -p leasehold
set -euo pipefail
cd "$(dirname "$0")/.."
leases=${1:-1000000}
bin=$PWD/target/release/leasehold
[ -x "$bin" ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "etcdctl not found (apt-get install etcd-client)" >&2; exit 2; }
read -r -a targets <<<"${TARGETS:-etcd37 leasehold}"
if [[ " ${targets[*]} " == *" etcd "* ]]; then
  command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 2; }
fi
# shellcheck source=lib/go-tools.sh
. scripts/lib/go-tools.sh

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# shellcheck source=lib/member.sh
. scripts/lib/member.sh

# start TARGET CLIENT_PORT PEER_PORT: starts the member named m in $work/TARGET; sets $pid.
start() { start_member "$1" "$work/$1" m "$2" "$3" "m=http://127.0.0.1:$3" etcd-cluster; }

# ttls ENDPOINT IDS...: the remaining TTL of each lease (decimal ids), space-separated.
ttls() {
  local e=$1; shift
  for id in "$@"; do
    "$bin" lease timetolive --endpoints "$e" -w json "$(printf '%x' "$id")" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["ttl"])'
  done | tr '\n' ' '
}

results="$work/results.jsonl"
for target in "${targets[@]}"; do
  c=$(free_port); p=$(free_port); e="http://127.0.0.1:$c"
  start "$target" "$c" "$p"
  ready "$e" 120
  fill=$("$bin" bench lease-memory --endpoints "$e" --server-pid "$pid" --total "$leases" \
    --clients 64 --conns 8 --timeout-secs 3600 -w json)
  samples=$(python3 -c 'import json,sys; print(" ".join(map(str, json.loads(sys.argv[1])["sample_leases"])))' "$fill")
  # shellcheck disable=SC2086
  before=$(ttls "$e" $samples)
  t0=$(now_ns); kill -TERM "$pid"; wait "$pid" || true; t1=$(now_ns)
  start "$target" "$c" "$p"
  ready "$e" 120; t2=$(now_ns)
  # shellcheck disable=SC2086
  after=$(ttls "$e" $samples)
  keys=$("$bin" get --endpoints "$e" --command-timeout 60s --prefix --count-only registry/ -w json |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("count", 0))')
  sleep 3   # what the restart itself allocated and freed settles
  rss_restarted=$(awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$pid/status")
  kill -TERM "$pid"; wait "$pid" || true; pid=
  python3 - "$target" "$fill" "$before" "$after" "$keys" "$rss_restarted" \
    "$(( (t1 - t0) / 1000000 ))" "$(( (t2 - t1) / 1000000 ))" <<'PY' | tee -a "$results"
import json, sys
target, fill, before, after, keys, rss, stop_ms, restart_ms = sys.argv[1:]
fill = json.loads(fill)
print(json.dumps({
    "target": target, "leases": fill["requests"] // 2,
    "grant_and_put_per_s": fill["throughput_per_s"],
    "bytes_per_lease": fill["bytes_per_lease"], "bytes_per_key": fill["bytes_per_key"],
    "rss_leases_and_keys_bytes": fill["rss_leases_and_keys_bytes"],
    "rss_after_restart_bytes": int(rss),
    "sigterm_to_exit_ms": int(stop_ms), "restart_to_linearizable_read_ms": int(restart_ms),
    "ttl_before_restart": [int(x) for x in before.split()],
    "ttl_after_restart": [int(x) for x in after.split()],
    "keys_after_restart": int(keys),
}))
PY
done
history="$work/history.jsonl"
rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$1/status"; }
for target in "${targets[@]}"; do
  c=$(free_port); p=$(free_port); e="http://127.0.0.1:$c"
  rm -rf "${work:?}/$target"
  start "$target" "$c" "$p"
  ready "$e" 120
  sleep 3; before=$(rss "$pid")
  "$bin" bench put --endpoints "$e" --total 100000 --val-size 1024 --key-space-size 1000 \
    --clients 64 --conns 8 --timeout-secs 1800 -w json >/dev/null
  sleep 3; written=$(rss "$pid")
  rev=$("$bin" get --endpoints "$e" -w json history-probe |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
  etcdctl --endpoints "$e" compaction --physical "$rev" >/dev/null
  sleep 5; compacted=$(rss "$pid")
  kill -TERM "$pid"; wait "$pid" || true; pid=
  echo "{\"target\": \"$target\", \"rss_before\": $before, \"rss_100k_revisions\": $written, \"rss_compacted\": $compacted}" | tee -a "$history"
done
python3 - "$results" "$history" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hist = {r["target"]: r for r in map(json.loads, open(sys.argv[2]))}
base = rows[0]
mib = lambda b: b / 2**20
print(f"\n{base['leases']:,} leases, one key each (ratios against {base['target']})\n")
print("| figure | " + " | ".join(r["target"] for r in rows) + " | " +
      " | ".join(f"{r['target']}/{base['target']}" for r in rows[1:]) + " |")
print("|---|" + "---:|" * (2 * len(rows) - 1))
for name, key, fmt in [
    ("bytes per idle lease", "bytes_per_lease", "{:.0f}"),
    ("bytes per attached key", "bytes_per_key", "{:.0f}"),
    ("RSS with leases and keys (MiB)", "rss_leases_and_keys_bytes", "mib"),
    ("RSS 3 s after the restart's first read (MiB)", "rss_after_restart_bytes", "mib"),
    ("SIGTERM to exit (ms)", "sigterm_to_exit_ms", "{:.0f}"),
    ("restart to first linearizable read (ms)", "restart_to_linearizable_read_ms", "{:.0f}"),
    ("grants and puts per second while filling", "grant_and_put_per_s", "{:.0f}"),
]:
    show = (lambda v: f"{mib(v):.0f}") if fmt == "mib" else (lambda v: fmt.format(v))
    a = base[key]
    print(f"| {name} | " + " | ".join(show(r[key]) for r in rows) + " | " +
          " | ".join(f"{r[key] / a if a else float('nan'):.2f}" for r in rows[1:]) + " |")
for r in rows:
    fresh = any(a > b for a, b in zip(r["ttl_after_restart"], r["ttl_before_restart"]))
    print(f"\n{r['target']}: sampled TTLs {r['ttl_before_restart']} before, {r['ttl_after_restart']} after"
          f" ({'a FRESH TTL' if fresh else 'none longer'}); {r['keys_after_restart']:,} keys after the restart")
print("\nHistory: 100,000 puts of 1 KiB values over 1,000 keys, then a compaction to the current revision\n")
names = [r["target"] for r in rows]
print("| figure | " + " | ".join(names) + " |")
print("|---|" + "---:|" * len(names))
per = lambda r, k: (r[k] - r["rss_before"]) / 100000
print("| RSS bytes per revision kept | " + " | ".join(f"{per(hist[n], 'rss_100k_revisions'):.0f}" for n in names) + " |")
print("| RSS bytes per revision after the compaction | " + " | ".join(f"{per(hist[n], 'rss_compacted'):.0f}" for n in names) + " |")
print("| RSS after the compaction (MiB) | " + " | ".join(f"{hist[n]['rss_compacted'] / 2**20:.0f}" for n in names) + " |")
PY
