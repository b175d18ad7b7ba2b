#!/usr/bin/env bash
# The consensus-core issue's moonshot: a million live leases on a 3-member leasehold cluster,
# TTL 30 s, each renewed TTL/3 after its last answer (clientv3's pace: 100,000 renewals/s for a
# million), over one keepalive stream per member, so every member takes renewals and the
# followers forward theirs. Prints the bench's JSON line (leases lost, renewals/s, latencies)
# and each member's RSS at the end. leasehold only: etcd is not run at this size.
#
#   scripts/bench-moonshot.sh [leases] [seconds]    (default 1000000 leases, 40 s measured)
#   KEEP=1 keeps the members' logs and data dirs.
#
# Build first: cargo build --release -p leasehold
set -euo pipefail
cd "$(dirname "$0")/.."
leases=${1:-1000000}
seconds=${2:-40}
bin=$PWD/target/release/leasehold
[ -x "$bin" ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }

# shellcheck source=lib/ports.sh
. scripts/lib/ports.sh
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "logs and data kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
# shellcheck source=lib/member.sh
. scripts/lib/member.sh

clients=() peers=() cluster="" urls=""
for i in 0 1 2; do clients+=("$(free_port)"); peers+=("$(free_port)"); done
for i in 0 1 2; do
  cluster+="${cluster:+,}m$i=http://127.0.0.1:${peers[$i]}"
  urls+="${urls:+,}http://127.0.0.1:${clients[$i]}"
done
for i in 0 1 2; do
  start_member leasehold "$work/m$i" "m$i" "${clients[$i]}" "${peers[$i]}" "$cluster" moonshot
  pids+=("$pid")
done
for i in 0 1 2; do ready "http://127.0.0.1:${clients[$i]}" 60; done

"$bin" bench lease-keepalive --endpoints "$urls" --leases "$leases" --streams 3 --conns 3 \
  --ttl-secs 30 --paced --duration "$seconds" --timeout-secs 1800 -w json
for i in 0 1 2; do
  echo "m$i RSS $(awk '/^VmRSS:/ {print int($2 / 1024)}' "/proc/${pids[$i]}/status") MiB," \
    "peak $(awk '/^VmHWM:/ {print int($2 / 1024)}' "/proc/${pids[$i]}/status") MiB"
done
