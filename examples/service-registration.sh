#!/bin/sh
# Service registration with a lease.
#
# A "service" registers itself as services/api-1 with a lease and keeps the lease alive; a
# watcher sees it appear; the registration outlives its TTL while the keep-alive runs; the
# service is killed (kill -9: no goodbye), its lease runs out, and the watcher sees the
# registration disappear within the TTL.
#
#   examples/service-registration.sh [ENDPOINT]      default 127.0.0.1:2379, TTL=5 by default
#
# The registration must be gone within TTL + SLACK_MS (default 1000 ms) of the kill.
#
# Uses the `leasehold` client commands (LEASEHOLD=/path/to/leasehold to pick a binary);
# LEASEHOLD=etcdctl works too. Exits non-zero if anything does not happen as described.
set -eu
CTL=${LEASEHOLD:-leasehold}
ENDPOINT=${1:-127.0.0.1:2379}
TTL=${TTL:-5}
SLACK_MS=${SLACK_MS:-1000}
ctl() { ETCDCTL_API=3 "$CTL" --endpoints="$ENDPOINT" "$@"; }
now_ms() { date +%s%3N; }
work=$(mktemp -d)
service=""
watcher=""
cleanup() {
  [ -n "$service" ] && kill "$service" 2>/dev/null
  [ -n "$watcher" ] && kill "$watcher" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# wait_for PATTERN SECONDS: until the watcher has printed a line matching PATTERN.
wait_for() {
  i=0
  while ! grep -q "$1" "$work/watch.log"; do
    i=$((i + 1))
    [ "$i" -gt $(($2 * 20)) ] && return 1
    sleep 0.05
  done
}

# The watcher starts from the next revision, so it misses nothing however late it starts.
rev=$(ctl get services/ --prefix -w json | sed -n 's/.*"revision":\([0-9]*\).*/\1/p')
(exec "$CTL" --endpoints="$ENDPOINT" watch --prefix services/ --rev=$((rev + 1)) >"$work/watch.log") &
watcher=$!

# The service: a lease, the registration, and a keep-alive running alongside.
lease=$(ctl lease grant "$TTL" | awk '{print $2}')
ctl put --lease="$lease" services/api-1 127.0.0.1:8080 >/dev/null
(exec "$CTL" --endpoints="$ENDPOINT" lease keep-alive "$lease" >/dev/null) &
service=$!

wait_for '^PUT$' 5 || { echo "the watcher never saw the registration" >&2; exit 1; }
echo "registered services/api-1 with lease $lease (TTL ${TTL}s); the watcher saw it appear"

sleep $((TTL + 1))
ctl get services/api-1 --print-value-only | grep -q 127.0.0.1:8080 ||
  { echo "the registration did not outlive its TTL" >&2; exit 1; }
echo "still registered after $((TTL + 1))s: the keep-alive renews the lease"

kill -9 "$service"
killed=$(now_ms)
service=""
wait_for '^DELETE$' $((TTL + 3)) || { echo "the watcher never saw the service go" >&2; exit 1; }
gone=$(now_ms)
echo "service killed; the watcher saw services/api-1 disappear $((gone - killed)) ms later (TTL ${TTL}s)"
[ $((gone - killed)) -le $((TTL * 1000 + SLACK_MS)) ] ||
  { echo "that is later than the TTL allows" >&2; exit 1; }
