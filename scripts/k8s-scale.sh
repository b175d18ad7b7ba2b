#!/usr/bin/env bash
# A whole Kubernetes control plane on each store, with kwok's fake nodes and pods, timed phase by
# phase and checked at the end.
#
#   scripts/k8s-scale.sh [--nodes N] [--pods P] [--targets "leasehold:1 etcd:1 ..."] [--check]
#
# The targets are leasehold:1 leasehold:3 etcd:1 etcd:3 (the default: all four); etcd is 3.7.3.
# Every target gets a fresh store and a fresh control plane:
#  - kube-apiserver, kube-controller-manager and kube-scheduler (Kubernetes v1.37.2, built from
#    go/tools/kubernetes), the controllers and the scheduler at 100 requests/s (burst 200), as
#    scale tests run them; both restarted when they exit, as a kubelet restarts static pods;
#  - kwok v0.8.0 (go/tools/kwok) with kwok's own default stages, read from the module it was
#    built from: nodes initialized at once, Lease heartbeats every 10 s (40 s leases) and a
#    status update every 10 min, pods Running as soon as they are bound, deleted pods removed.
# The phases (scripts/lib/k8s_scale.py):
#  1. nodes: N fake nodes registered, until kwok has made every one Ready;
#  2. pods: Deployments of 50 replicas totalling P pods over 10 namespaces, created one at a time
#     at --pod-rate pods a second (default 40), as scale tests pace them, until every pod is bound
#     and Running;
#  3. scale-down: every Deployment to half, until only those pods are left (on 3 members the
#     store's leader is killed -9 at the start of this phase and started again at its end);
#  4. scale-up: back to full, all at once (kube-apiserver is killed -9 and started again at the
#     start, so its watch cache lists everything again);
#  5. namespace: one namespace deleted, and made again with its Deployments, until Running;
#  6. the check: every Deployment's pods bound and Running, N Ready nodes, nothing lost;
#  7. delete: every namespace and node deleted, until gone, and an apiserver compaction after it.
# Figures per target: each phase's time; pods/s created, bound and Running; pod startup p50/p99
# (first seen by a watch to Running: the paced pods of phase 2, and the burst of phases 4-5
# apart); the apiserver's request latency p50/p99 by verb
# (apiserver_request_duration_seconds) and its store latency (etcd_request_duration_seconds);
# watch events sent; 5xx answers and the controllers' own failed requests; the store's CPU seconds
# and peak RSS; and phase by phase, the store's p99, each member's largest RSS (sampled once a
# second) and the CPU seconds of the store and of the control plane; and phase 3's (the leader's
# kill) store p99 operation by operation. A table of the targets side
# by side is printed at the end. It is written to <work>/summary.md after each target, so a run
# stopped part way keeps the targets it finished (the work directory is then left in place);
# --json FILE writes the figures too.
#
# --check (scripts/test.sh) fails unless every target ran every phase and passed the final-state
# check. Without it the run is a benchmark: a target that stops short (a phase that timed out, a
# wrong final state) is reported in the table's last row, and the exit status is 0.
# KEEP=1 keeps the work directory (every process's log).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/go-tools.sh
source scripts/lib/require.sh

for need in openssl python3; do
  command -v "$need" >/dev/null 2>&1 || { echo "k8s-scale: $need not found" >&2; exit 2; }
done
find_leasehold

find_go
# Each in a variable of its own: a failed build then stops the script (set -e), where inside
# exec's arguments it would pass an empty path on.
etcd=$(etcd37_bin)
etcdctl=$(etcdctl37_bin)
apiserver=$(kube_apiserver_bin)
controller_manager=$(kube_controller_manager_bin)
scheduler=$(kube_scheduler_bin)
kwok=$(kwok_bin)
# kwok's default stages come from the module kwok was built from, as kwokctl embeds them
# (`go mod download` fetches it when the module cache lacks it).
kwok_src=$(cd go/tools/kwok && go mod download -json sigs.k8s.io/kwok | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
stages="$kwok_src/kustomize/stage"
[ -f "$stages/pod/fast/pod-ready.yaml" ] || { echo "k8s-scale: kwok's stages not found under $stages" >&2; exit 2; }

exec python3 scripts/lib/k8s_scale.py \
  --leasehold "$lh_bin" --etcd "$etcd" --etcdctl "$etcdctl" --apiserver "$apiserver" \
  --controller-manager "$controller_manager" --scheduler "$scheduler" \
  --kwok "$kwok" --kwok-stages "$stages" "$@"
