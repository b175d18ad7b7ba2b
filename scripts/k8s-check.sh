#!/usr/bin/env bash
# Runs a real kube-apiserver on leasehold and on etcd 3.7, drives the same scenario through
# kubectl, curl and etcdctl on each, and fails unless every figure matches.
#
#   scripts/k8s-check.sh [TARGET...]     TARGET: leasehold:1 leasehold:3 etcd:1 etcd:3 (the default)
#
# kube-apiserver, kubectl (Kubernetes v1.37.2), etcd and etcdctl (3.7.3) are built from the Go
# module proxy through the wrapper modules in go/tools, once, into ~/.cache/leasehold-tools
# (scripts/lib/go-tools.sh). leasehold is $LEASEHOLD_BIN, else target/release/leasehold, else
# target/debug/leasehold.
#
# The scenario (each step's figures go to <work>/<target>/figures; the timings are printed, not
# compared):
#  - kube-apiserver with only what it needs: --etcd-servers, a self-signed serving certificate
#    (--cert-dir), a service-account key, a token file and RBAC; --event-ttl=20s,
#    --endpoint-reconciler-type=lease, --etcd-compaction-interval=10s, and configmaps without a
#    watch cache (--watch-cache-sizes=configmaps#0), so their LISTs and watches go straight to
#    the store while secrets and namespaces go through the cache as usual;
#  - 1,000 namespaces; on 3 members the store's leader is killed (SIGKILL) while they are
#    created, the creation goes on against the survivors, and every namespace kubectl saw
#    acknowledged must be there afterwards;
#  - watches opened from a resourceVersion: configmaps (uncached), secrets (cached) and events
#    (uncached);
#  - 1,000 configmaps and 1,000 secrets;
#  - kubectl get --chunk-size=37 (limit and continue);
#  - kubectl replace with a stale resourceVersion (409: the txn's mod_revision compare);
#  - deletes of half the configmaps and a tenth of the secrets;
#  - a CustomResourceDefinition, 100 of its objects, 50 deleted;
#  - 100 events, which must all be gone after --event-ttl (etcd leases), their deletes watched;
#  - /registry/masterleases/ (a key on a lease with a TTL) and the kubernetes endpoints;
#  - the apiserver's own compaction: an exact-resourceVersion LIST at the first revision must
#    turn 410 Expired;
#  - /readyz?verbose with its etcd checks.
#
# KEEP=1 keeps the work directory (logs of every member and of kube-apiserver).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/ports.sh
source scripts/lib/go-tools.sh
source scripts/lib/require.sh

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(leasehold:1 leasehold:3 etcd:1 etcd:3)

for need in openssl curl python3; do
  command -v "$need" >/dev/null 2>&1 || { echo "k8s-check: $need not found" >&2; exit 2; }
done
find_leasehold
etcd_bin=$(etcd37_bin)
etcdctl=$(etcdctl37_bin)
apiserver=$(kube_apiserver_bin)
kubectl=$(kubectl_bin)

work=$(mktemp -d /tmp/leasehold-k8s-check.XXXXXX)
pids=()
cleanup() {
  local status=$?
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ] || [ $status -ne 0 ]; then echo "work directory kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
log() { echo "[$(date +%T)] $*" >&2; }
fail() { echo "k8s-check: $*" >&2; exit 1; }

# Shared by every target: the service-account key pair, the token file and objects to create.
openssl genrsa -out "$work/sa.key" 2048 2>/dev/null
openssl rsa -in "$work/sa.key" -pubout -out "$work/sa.pub" 2>/dev/null
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,admin,admin,\"system:masters\"" >"$work/tokens.csv"
python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
def write(name, items):
    with open(f"{work}/{name}.json", "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
write("namespaces", [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"scen-{i:04}"}}
                     for i in range(1000)])
write("configmaps", [{"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": f"cm-{i:04}", "namespace": "scenario",
                                   "labels": {"parity": "odd" if i % 2 else "even"}},
                      "data": {"index": str(i), "payload": "x" * 512}} for i in range(1000)])
write("secrets", [{"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": f"secret-{i:04}", "namespace": "scenario",
                                "labels": {"tenth": "yes" if i % 10 == 0 else "no"}},
                   "stringData": {"password": f"p{i}"}} for i in range(1000)])
write("widgets", [{"apiVersion": "leasehold.test/v1", "kind": "Widget",
                   "metadata": {"name": f"w-{i:03}", "namespace": "scenario",
                                "labels": {"half": "a" if i < 50 else "b"}},
                   "spec": {"size": i}} for i in range(100)])
write("events", [{"apiVersion": "v1", "kind": "Event",
                  "metadata": {"name": f"ev-{i:03}", "namespace": "scenario"},
                  "involvedObject": {"kind": "ConfigMap", "name": "cm-0000", "namespace": "scenario"},
                  "reason": "Check", "message": f"event {i}", "type": "Normal"} for i in range(100)])
json.dump({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.leasehold.test"},
           "spec": {"group": "leasehold.test", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {
                                          "size": {"type": "integer"}}}}}}}]}},
          open(f"{work}/crd.json", "w"))
EOF

# summarize_watch FILE: one line per event type with its count, and a digest of the (type, name)
# sequence, from a watch stream of JSON lines.
summarize_watch() {
  python3 - "$1" <<'EOF'
import collections, hashlib, json, sys
counts, seq = collections.Counter(), []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    ev = json.loads(line)
    kind = ev["type"]
    name = ev["object"].get("metadata", {}).get("name", "?")
    if kind == "ERROR":
        name = str(ev["object"].get("code"))
    counts[kind] += 1
    seq.append(f"{kind} {name}")
print(" ".join(f"{k}={counts[k]}" for k in sorted(counts)) or "none",
      "order", hashlib.sha256("\n".join(seq).encode()).hexdigest()[:12])
EOF
}

# run TARGET: one whole scenario on a fresh store; figures to $work/TARGET/figures.
run() {
  local kind=${1%%:*} n=${1##*:}
  local dir="$work/$kind-$n"
  mkdir -p "$dir"
  local figures="$dir/figures" timings="$dir/timings"
  : >"$figures"; : >"$timings"
  fig() { echo "$*" >>"$figures"; }
  local t0 step_started
  step() { step_started=$(now_ms); log "$1 $2"; }
  step_done() { echo "$1 $(( $(now_ms) - step_started ))" >>"$timings"; }

  local bin=$lh_bin
  [ "$kind" = etcd ] && bin=$etcd_bin
  [ "$kind" = etcd ] || [ "$kind" = leasehold ] || fail "unknown target $1"
  local ports=() cluster="" eps="" member_pids=()
  for ((i = 0; i < n; i++)); do ports+=("$(free_port)" "$(free_port)"); done
  for ((i = 0; i < n; i++)); do cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[2*i+1]}"; eps+="${eps:+,}http://127.0.0.1:${ports[2*i]}"; done
  for ((i = 0; i < n; i++)); do
    local c=${ports[2*i]} p=${ports[2*i+1]}
    LEASEHOLD_LOG=warn "$bin" --name "m$i" --data-dir "$dir/m$i" --log-level warn \
      --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
      --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
      --initial-cluster "$cluster" --initial-cluster-token k8s-check >"$dir/m$i.log" 2>&1 &
    member_pids+=($!); pids+=($!)
  done
  local deadline=$((SECONDS + 30))
  until "$etcdctl" --endpoints "$eps" --dial-timeout 1s --command-timeout 2s get ready-probe >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$1: the store never answered (logs in $dir)"
    sleep 0.05
  done

  local port; port=$(free_port)
  step "$1" "kube-apiserver starting on :$port"
  # The endpoint reconciler refuses a loopback advertise address; 192.0.2.10 (TEST-NET-1, never
  # routed) is only written into the kubernetes Endpoints and masterleases: nothing dials it.
  "$apiserver" --etcd-servers="$eps" --bind-address=127.0.0.1 --advertise-address=192.0.2.10 \
    --secure-port="$port" --cert-dir="$dir/certs" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-signing-key-file="$work/sa.key" --service-account-key-file="$work/sa.pub" \
    --token-auth-file="$work/tokens.csv" --authorization-mode=RBAC \
    --service-cluster-ip-range=10.96.0.0/16 \
    --event-ttl=20s --endpoint-reconciler-type=lease --etcd-compaction-interval=10s \
    --watch-cache-sizes=configmaps#0 >"$dir/kube-apiserver.log" 2>&1 &
  local api_pid=$!; pids+=($api_pid)
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: check, cluster: {server: "https://127.0.0.1:$port", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: "$token"}}]
contexts: [{name: check, context: {cluster: check, user: admin}}]
current-context: check
EOF
  k() { "$kubectl" --kubeconfig "$dir/kubeconfig" --request-timeout=30s "$@"; }
  api() { curl -sk -H "Authorization: Bearer $token" "https://127.0.0.1:$port$1"; }
  deadline=$((SECONDS + 90))
  until [ "$(api /readyz 2>/dev/null)" = ok ]; do
    kill -0 $api_pid 2>/dev/null || fail "$1: kube-apiserver exited (log: $dir/kube-apiserver.log)"
    [ $SECONDS -lt $deadline ] || fail "$1: kube-apiserver not ready after 90 s (log: $dir/kube-apiserver.log)"
    sleep 0.2
  done
  step_done "apiserver-ready"

  k create namespace scenario >/dev/null

  step "$1" "1,000 namespaces$([ "$n" -gt 1 ] && echo ", the store's leader killed meanwhile")"
  k create -f "$work/namespaces.json" >"$dir/namespaces.out" 2>&1 &
  local create_pid=$!
  if [ "$n" -gt 1 ]; then
    # Kill the leader once a tenth of the namespaces is in.
    deadline=$((SECONDS + 60))
    # (Before kubectl has written anything the file may not exist yet: count that as 0.)
    until created=$(grep -c ' created$' "$dir/namespaces.out" 2>/dev/null); [ "${created:-0}" -ge 100 ]; do
      [ $SECONDS -lt $deadline ] || fail "$1: namespace creation stalled before the kill"
      sleep 0.05
    done
    local leader_index
    leader_index=$("$etcdctl" --endpoints "$eps" endpoint status -w json 2>/dev/null | python3 -c '
import json, sys
for i, s in enumerate(json.load(sys.stdin)):
    if s["Status"]["leader"] == s["Status"]["header"]["member_id"]:
        print(i); break')
    [ -n "$leader_index" ] || fail "$1: no leader found to kill"
    kill -9 "${member_pids[$leader_index]}"
    wait "${member_pids[$leader_index]}" 2>/dev/null || true # reaped here, so bash says nothing
    log "$1 killed the leader, m$leader_index, after $(grep -c ' created$' "$dir/namespaces.out") namespaces"
    eps=$(echo "$eps" | tr , '\n' | sed "$((leader_index + 1))d" | paste -sd,)
  fi
  wait $create_pid || true
  # What failed during the election is created again; what was acknowledged must all be there.
  grep ' created$' "$dir/namespaces.out" | sed 's#^namespace/##; s# created$##' | sort >"$dir/namespaces.acked"
  local acked; acked=$(wc -l <"$dir/namespaces.acked")
  echo "namespace-creates-failed-at-kill $((1000 - acked))" >>"$timings"
  if [ "$acked" -lt 1000 ]; then
    log "$1 $((1000 - acked)) namespace creations failed: creating them again"
    k create -f "$work/namespaces.json" >"$dir/namespaces-retry.out" 2>&1 || true
  fi
  step_done "create-1000-namespaces"
  k get namespaces -o name --chunk-size=0 | sed -n 's#^namespace/\(scen-\)#\1#p' | sort >"$dir/namespaces.listed"
  fig "namespaces listed: $(wc -l <"$dir/namespaces.listed")"
  fig "acknowledged namespaces missing: $(comm -23 "$dir/namespaces.acked" "$dir/namespaces.listed" | wc -l)"

  # Watches from a resourceVersion, opened once the store is stable (on 3 members an uncached
  # watch that crosses the kill may resume below the apiserver's compaction, on etcd as on
  # leasehold, and then ends in 410 by chance of which member served it).
  local rv0
  rv0=$(api /api/v1/namespaces/scenario/configmaps | python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["resourceVersion"])')
  [ -n "$rv0" ] || fail "$1: no resourceVersion from an empty list"
  local watch_pids=()
  for what in configmaps secrets events; do
    curl -sk -N -H "Authorization: Bearer $token" \
      "https://127.0.0.1:$port/api/v1/namespaces/scenario/$what?watch=1&resourceVersion=$rv0" \
      >"$dir/watch-$what.jsonl" 2>/dev/null &
    watch_pids+=($!); pids+=($!)
  done

  step "$1" "1,000 configmaps"
  k create -f "$work/configmaps.json" >"$dir/configmaps.out" 2>&1 || fail "$1: configmaps: $(tail -3 "$dir/configmaps.out")"
  step_done "create-1000-configmaps"
  fig "configmaps created: $(grep -c ' created$' "$dir/configmaps.out")"
  step "$1" "1,000 secrets"
  k create -f "$work/secrets.json" >"$dir/secrets.out" 2>&1 || fail "$1: secrets: $(tail -3 "$dir/secrets.out")"
  step_done "create-1000-secrets"
  fig "secrets created: $(grep -c ' created$' "$dir/secrets.out")"

  step "$1" "paged lists (--chunk-size=37)"
  fig "namespaces paged: $(k get namespaces -o name --chunk-size=37 | grep -c '^namespace/scen-')"
  fig "configmaps paged: $(k get configmaps -n scenario -o name --chunk-size=37 | grep -c '^configmap/cm-')"
  fig "secrets paged: $(k get secrets -n scenario -o name --chunk-size=37 | grep -c '^secret/secret-')"
  step_done "list-3000-paged-37"
  local rv_page
  rv_page=$(api "/api/v1/namespaces/scenario/configmaps?limit=400" | python3 -c '
import json, sys; d = json.load(sys.stdin); print(len(d["items"]), d["metadata"].get("remainingItemCount"), bool(d["metadata"].get("continue")))')
  fig "configmaps first page of 400: items, remaining, continue: $rv_page"

  step "$1" "a stale update"
  k get configmap cm-0001 -n scenario -o json >"$dir/cm-0001.json"
  k label configmap cm-0001 -n scenario touched=yes >/dev/null
  if k replace -f "$dir/cm-0001.json" >"$dir/stale.out" 2>&1; then
    fig "stale replace: accepted"
  else
    fig "stale replace: $(grep -o 'the object has been modified' "$dir/stale.out" | head -1)"
  fi
  step_done "stale-update"

  step "$1" "deletes"
  k delete configmaps -n scenario -l parity=odd --wait=false >"$dir/delete-cm.out"
  k delete secrets -n scenario -l tenth=yes --wait=false >"$dir/delete-secret.out"
  step_done "delete-600"
  fig "configmaps deleted: $(grep -c ' deleted' "$dir/delete-cm.out")"
  fig "secrets deleted: $(grep -c ' deleted' "$dir/delete-secret.out")"
  fig "configmaps left: $(k get configmaps -n scenario -o name | grep -c '^configmap/cm-')"
  fig "secrets left: $(k get secrets -n scenario -o name | grep -c '^secret/secret-')"

  step "$1" "a custom resource"
  k create -f "$work/crd.json" >/dev/null
  k wait --for condition=established --timeout=60s crd/widgets.leasehold.test >/dev/null
  # The discovery of the new type can trail its Established condition by a moment.
  deadline=$((SECONDS + 30))
  until k get widgets -n scenario >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$1: widgets never served"
    sleep 0.2
  done
  k create -f "$work/widgets.json" >"$dir/widgets.out"
  fig "widgets created: $(grep -c ' created$' "$dir/widgets.out")"
  k delete widgets -n scenario -l half=a --wait=false >"$dir/widgets-delete.out"
  fig "widgets deleted: $(grep -c ' deleted' "$dir/widgets-delete.out")"
  fig "widgets left: $(k get widgets -n scenario -o name | wc -l)"
  step_done "crd-100-objects"

  step "$1" "100 events, gone after --event-ttl"
  k create -f "$work/events.json" >"$dir/events.out"
  fig "events created: $(grep -c ' created$' "$dir/events.out")"
  local events_made=$SECONDS
  deadline=$((SECONDS + 90))
  while [ "$(k get events -n scenario -o name | grep -c '^event/ev-')" -gt 0 ]; do
    [ $SECONDS -lt $deadline ] || { fig "events left after 90 s: $(k get events -n scenario -o name | grep -c '^event/ev-')"; break; }
    sleep 1
  done
  fig "events left: $(k get events -n scenario -o name | grep -c '^event/ev-' || true)"
  echo "events-gone-after-s $((SECONDS - events_made))" >>"$timings"
  step_done "events-expiry"

  # masterleases: a key on a lease with a TTL, refreshed every 10 s with a new lease.
  fig "masterlease: $("$etcdctl" --endpoints "$eps" get --prefix /registry/masterleases/ -w json | python3 -c '
import json, sys; kvs = json.load(sys.stdin).get("kvs", []); print(len(kvs), "keys,", sum(1 for kv in kvs if kv.get("lease")), "on a lease")')"
  fig "kubernetes endpoints: $(k get endpoints kubernetes -o jsonpath='{.subsets[0].addresses[*].ip}' 2>/dev/null)"

  step "$1" "compaction by the apiserver"
  local code=""
  deadline=$((SECONDS + 90))
  while :; do
    code=$(curl -sk -o "$dir/old-list.json" -w '%{http_code}' -H "Authorization: Bearer $token" \
      "https://127.0.0.1:$port/api/v1/namespaces/scenario/configmaps?resourceVersion=$rv0&resourceVersionMatch=Exact&limit=1")
    [ "$code" = 410 ] && break
    [ $SECONDS -lt $deadline ] || break
    sleep 1
  done
  fig "exact list at the first revision after compaction: HTTP $code"
  fig "compact_rev_key: $("$etcdctl" --endpoints "$eps" get compact_rev_key -w json | python3 -c '
import json, sys; kvs = json.load(sys.stdin).get("kvs", []); print(len(kvs), "key,", "written more than once" if kvs and kvs[0]["version"] > 1 else "written once or never")')"
  step_done "compaction-seen"

  # Readiness, with the etcd checks named.
  api "/readyz?verbose" >"$dir/readyz.txt" || true
  fig "readyz etcd: $(grep -E '^\[.\]etcd(-readiness)? ' "$dir/readyz.txt" | tr '\n' ' ')"
  fig "readyz: $(tail -1 "$dir/readyz.txt")"

  for p in "${watch_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for what in configmaps secrets events; do
    fig "watch $what: $(summarize_watch "$dir/watch-$what.jsonl")"
  done
  # kube-apiserver drains for a long time on SIGTERM; nothing of it is checked after this.
  kill -9 $api_pid 2>/dev/null || true
  for p in "${member_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "$api_pid" "${member_pids[@]}" 2>/dev/null || true
  log "$1 done"
}

for t in "${targets[@]}"; do run "$t"; done

# Compare: leasehold:N against etcd:N, figure by figure; then the timings side by side.
status=0
for t in "${targets[@]}"; do
  kind=${t%%:*} n=${t##*:}
  [ "$kind" = leasehold ] || continue
  other="$work/etcd-$n"
  echo
  echo "== $n member(s): leasehold | etcd 3.7.3"
  if [ -f "$other/figures" ]; then
    paste -d'|' "$work/leasehold-$n/figures" "$other/figures" | while IFS='|' read -r a b; do
      if [ "$a" = "$b" ]; then echo "  same: $a"; else echo "  DIFF: leasehold: $a | etcd: $b"; fi
    done
    cmp -s "$work/leasehold-$n/figures" "$other/figures" || status=1
  else
    sed 's/^/  /' "$work/leasehold-$n/figures"
  fi
  echo "   timings (ms): step | leasehold | etcd 3.7.3"
  join -a1 <(sort "$work/leasehold-$n/timings") <(sort "$other/timings" 2>/dev/null || true) | sed 's/^/     /'
done
[ $status -eq 0 ] || fail "leasehold and etcd 3.7 differ (work directory kept)"
echo
echo "k8s-check: every figure matches"
