#!/bin/sh
# Leader election with a hand-over on failure.
#
# node-a and node-b campaign for "election-demo" (each with a session lease of TTL seconds that
# it keeps alive); an observer prints every new leader. node-a wins, node-b waits; node-a is
# killed (kill -9: it never resigns), its lease runs out, and node-b takes over within the TTL.
#
#   examples/leader-election.sh [ENDPOINT]      default 127.0.0.1:2379, TTL=5 by default
#
# The hand-over must come within TTL + SLACK_MS (default 1000 ms) of the kill.
#
# Uses the `leasehold` client commands (LEASEHOLD=/path/to/leasehold to pick a binary); `elect
# --ttl` is leasehold's (etcdctl's elect has a fixed 60 s session). Exits non-zero if anything
# does not happen as described.
set -eu
CTL=${LEASEHOLD:-leasehold}
ENDPOINT=${1:-127.0.0.1:2379}
TTL=${TTL:-5}
SLACK_MS=${SLACK_MS:-1000}
now_ms() { date +%s%3N; }
work=$(mktemp -d)
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# wait_for FILE PATTERN SECONDS
wait_for() {
  i=0
  while ! grep -q "$2" "$1"; do
    i=$((i + 1))
    [ "$i" -gt $(($3 * 20)) ] && return 1
    sleep 0.05
  done
}

(exec "$CTL" --endpoints="$ENDPOINT" elect -l election-demo >"$work/observer.log") &
pids="$pids $!"
(exec "$CTL" --endpoints="$ENDPOINT" elect --ttl "$TTL" election-demo node-a >"$work/a.log") &
a=$!
pids="$pids $a"
wait_for "$work/a.log" '^node-a$' 10 || { echo "node-a was not elected" >&2; exit 1; }
echo "node-a leads: $(head -1 "$work/a.log")"

(exec "$CTL" --endpoints="$ENDPOINT" elect --ttl "$TTL" election-demo node-b >"$work/b.log") &
pids="$pids $!"
sleep 1
[ ! -s "$work/b.log" ] || { echo "node-b was elected while node-a led" >&2; exit 1; }
echo "node-b is waiting"

kill -9 "$a"
killed=$(now_ms)
wait_for "$work/b.log" '^node-b$' $((TTL + 3)) || { echo "node-b never took over" >&2; exit 1; }
took=$(($(now_ms) - killed))
echo "node-a killed; node-b leads $took ms later (TTL ${TTL}s): $(head -1 "$work/b.log")"
[ "$took" -le $((TTL * 1000 + SLACK_MS)) ] || { echo "that is later than the TTL allows" >&2; exit 1; }
wait_for "$work/observer.log" '^node-b$' 5 || { echo "the observer missed the hand-over" >&2; exit 1; }
echo "the observer saw: $(grep -c '^node-' "$work/observer.log") leaders ($(grep '^node-' "$work/observer.log" | tr '\n' ' '))"
