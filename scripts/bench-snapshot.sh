#!/usr/bin/env bash
# Snapshots, etcd and leasehold side by side. For each, a fresh single member on loopback ports
# with data on the same disk, filled with N puts of 256-byte values over N distinct keys, then:
#   1. `etcdctl snapshot save` (the same etcdctl 3.4 for both): its time and the file's size,
#      while `leasehold bench put` (16 clients, 5 s) writes to the same member: the writes'
#      rate and p99 during the save, against the same run before it;
#   2. `etcdctl snapshot status` of the file (bbolt's consistency check and a hash of every row);
#   3. a restore of the file with the member's own tool (`etcdctl snapshot restore`,
#      `leasehold snapshot restore`), then a start on it and the time until a linearizable read
#      answers, and the number of keys (nothing lost).
# Prints one JSON line per target, then a table.
#
#   scripts/bench-snapshot.sh [keys]      (default 1000000; needs `etcd` and `etcdctl` on PATH)
#
# Build first: cargo build --release -p leasehold
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${1:-1000000}
bin=$PWD/target/release/leasehold
[ -x "$bin" ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "etcdctl not found (apt-get install etcd-client)" >&2; exit 2; }
export ETCDCTL_API=3

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# shellcheck source=lib/member.sh
. scripts/lib/member.sh
ms_since() { echo $(( ($(now_ns) - $1) / 1000000 )); }

stop() { kill -TERM "$pid"; wait "$pid" || true; pid=; }

# writes ENDPOINT: 5 s of puts from 16 clients over other keys; prints the JSON summary.
writes() {
  "$bin" bench put --endpoints "$1" --clients 16 --conns 4 --duration 5 --key-space-size 1000 \
    --timeout-secs 60 -w json
}

# count ENDPOINT: the number of keys.
count() {
  "$bin" get --endpoints "$1" --command-timeout 120s --prefix --count-only "" -w json |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("count", 0))'
}

results="$work/results.jsonl"
for target in etcd leasehold; do
  c=$(free_port); p=$(free_port); e="http://127.0.0.1:$c"
  start_member "$target" "$work/$target" m "$c" "$p" "m=http://127.0.0.1:$p" "bench-$target"
  ready "$e" 300
  "$bin" bench put --endpoints "$e" --clients 64 --conns 8 --total "$keys" --key-space-size "$keys" \
    --sequential-keys --timeout-secs 3600 -w json >/dev/null
  quiet=$(writes "$e")
  file="$work/$target.snapshot.db"
  writes "$e" >"$work/during.json" &
  writer=$!
  sleep 0.5
  t0=$(now_ns)
  etcdctl --endpoints "$e" --command-timeout 600s snapshot save "$file" >/dev/null 2>&1
  save_ms=$(ms_since "$t0")
  wait "$writer"
  during=$(cat "$work/during.json")
  size=$(stat -c %s "$file")
  t0=$(now_ns)
  status=$(etcdctl snapshot status "$file" -w json)
  status_ms=$(ms_since "$t0")
  before=$(count "$e")
  stop
  c=$(free_port); p=$(free_port); e="http://127.0.0.1:$c"
  cluster="r=http://127.0.0.1:$p"
  restore_flags=(--data-dir "$work/$target-restored" --name r --initial-cluster "$cluster"
    --initial-cluster-token "restored-$target" --initial-advertise-peer-urls "http://127.0.0.1:$p")
  t0=$(now_ns)
  if [ "$target" = etcd ]; then
    etcdctl snapshot restore "$file" "${restore_flags[@]}" >/dev/null 2>&1
  else
    "$bin" snapshot restore "$file" "${restore_flags[@]}" 2>/dev/null
  fi
  restore_ms=$(ms_since "$t0")
  t0=$(now_ns)
  start_member "$target" "$work/$target-restored" r "$c" "$p" "$cluster" "restored-$target"
  ready "$e" 300
  start_ms=$(ms_since "$t0")
  after=$(count "$e")
  stop
  python3 - "$target" "$keys" "$save_ms" "$size" "$status_ms" "$restore_ms" "$start_ms" \
    "$before" "$after" "$quiet" "$during" "$status" >>"$results" <<'PY'
import json, sys
t, keys, save, size, st, restore, start, before, after, quiet, during, status = sys.argv[1:]
q, d = json.loads(quiet), json.loads(during)
print(json.dumps({"target": t, "keys": int(keys), "save_ms": int(save), "file_bytes": int(size),
  "status_ms": int(st), "restore_ms": int(restore), "restored_start_ms": int(start),
  "keys_before": int(before), "keys_after": int(after),
  "puts_per_s_quiet": q["throughput_per_s"], "put_p99_ms_quiet": q["p99_ms"],
  "puts_per_s_during_save": d["throughput_per_s"], "put_p99_ms_during_save": d["p99_ms"],
  "status": json.loads(status)}))
PY
  tail -1 "$results"
done
python3 - "$results" <<'PY'
import json, sys
rows = {r["target"]: r for r in map(json.loads, open(sys.argv[1]))}
e, l = rows["etcd"], rows["leasehold"]
def line(name, key, fmt="{:,}"):
    a, b = e[key], l[key]
    ratio = f"{b / a:.2f}×" if a else "-"
    print(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
print(f"\n{e['keys']:,} keys of 256 bytes\n")
print("| figure | etcd | leasehold | leasehold / etcd |\n|---|---:|---:|---:|")
line("`snapshot save`, ms", "save_ms")
line("file, bytes", "file_bytes")
line("`snapshot status`, ms", "status_ms")
line("restore (own tool), ms", "restore_ms")
line("start on the restored dir to first read, ms", "restored_start_ms")
line("puts/s, 16 clients, before the save", "puts_per_s_quiet", "{:,.0f}")
line("puts/s, 16 clients, during the save", "puts_per_s_during_save", "{:,.0f}")
line("put p99 ms before the save", "put_p99_ms_quiet", "{:.2f}")
line("put p99 ms during the save", "put_p99_ms_during_save", "{:.2f}")
for r in (e, l):
    assert r["keys_after"] == r["keys_before"], f"{r['target']} lost keys: {r}"
print(f"\nkeys before / after restore: etcd {e['keys_before']:,} / {e['keys_after']:,}, "
      f"leasehold {l['keys_before']:,} / {l['keys_after']:,}")
PY
