#!/usr/bin/env bash
# The lease failover scenario, side by side (go/clientv3's BenchmarkLeaseFailover): on 3 members of
# leasehold and of etcd 3.7, each with etcd's default timing (election timeout 1,000 ms), 1,000
# leases of TTL 3 s are kept alive with Go's clientv3 KeepAlive while the leader is killed -9 twice
# (started again each time a new leader leads). Prints, per round, the leases lost (their keys
# deleted while the client kept renewing) and the longest gap between keepalive answers.
#
#   scripts/bench-lease-failover.sh [rounds]     (default 10; each round a fresh cluster per target)
#
# LEASE_FAILOVER_TTL (seconds) and LEASE_FAILOVER_ELECTION_MS change the shape. A round that lost
# leases says how many clientv3 gave up on (no answer for a whole TTL) and details the others.
#
# Build first: cargo build --release -p leasehold. etcd 3.7 is built from the Go module proxy
# (scripts/lib/go-tools.sh), as scripts/test.sh builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
bin=$PWD/target/release/leasehold
[ -x "$bin" ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
# shellcheck source=lib/go-tools.sh
. scripts/lib/go-tools.sh
find_go
etcd37=$(etcd37_bin)
cd go/clientv3
LEASEHOLD_BIN="$bin" ETCD37_BIN="$etcd37" LEASE_FAILOVER_ROUNDS="$rounds" \
  go test -count=1 -run '^$' -bench '^BenchmarkLeaseFailover$' -benchtime 1x -timeout 60m . |
  grep -E '^failover |^BenchmarkLeaseFailover'
