#!/usr/bin/env bash
# Runs leasehold's whole test suite. First installs what the tests need when it is missing:
#   etcd + etcdctl (Debian's etcd-server, etcd-client): the differential tests run a real etcd;
#   protoc (Debian's protobuf-compiler) and the well-known .proto files it imports
#   (Debian's libprotobuf-dev, /usr/include/google/protobuf/descriptor.proto): the etcd-client
#   crate used by the tests needs both to build;
#   curl: the HTTP endpoint tests read /health, /livez, /readyz and /version with it.
#   python3-etcd3 (Debian's, for /usr/bin/python3): tests/e2e/python_client.rs drives the Python etcd
#   client library against etcd and leasehold;
#   chromium (Debian's, no recommends): tests/e2e/dashboard.rs opens /dashboard in headless Chromium,
#   driven over the DevTools protocol (no chromium-driver needed). As root it needs --no-sandbox,
#   which the test kit passes.
#   openssl: scripts/k8s-check.sh makes kube-apiserver's service-account key with it.
# Then, from the Go module proxy (the machine's Go 1.26 or newer, else Go 1.26.8 fetched from the
# proxy too; scripts/lib/go-tools.sh), built
# once into ~/.cache/leasehold-tools: etcd 3.7 for go/clientv3, Go's etcd client run against
# leasehold and etcd 3.7 side by side, and kube-apiserver and kubectl for scripts/k8s-check.sh,
# which runs a real kube-apiserver on leasehold (1 and 3 members) and on etcd 3.7;
# kube-controller-manager, kube-scheduler and kwok (sigs.k8s.io/kwok) for scripts/k8s-scale.sh,
# a whole control plane with fake nodes and pods on each store; and etcd's own
# end-to-end suite (tests/common, go.etcd.io/etcd/tests/v3) with leasehold as its `etcd`.
# The leasehold binary itself builds with cargo alone.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
python_etcd3() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import etcd3' >/dev/null 2>&1; }
python_etcd3 || missing+=(python3-etcd3)
# Check the header file itself, not only the binary: protobuf-compiler without recommends does not
# bring it, and etcd-client's build fails with 'google/protobuf/descriptor.proto: File not found'.
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing test dependencies: ${missing[*]}" >&2
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
for need in etcd etcdctl protoc curl chromium openssl; do
  command -v "$need" >/dev/null 2>&1 || { echo "test.sh: $need is still missing after install" >&2; exit 1; }
done
[ -f /usr/include/google/protobuf/descriptor.proto ] ||
  { echo "test.sh: google/protobuf/descriptor.proto is still missing after install" >&2; exit 1; }
python_etcd3 || { echo "test.sh: /usr/bin/python3 cannot import etcd3 after install" >&2; exit 1; }
# Chromium must also start headless here (as root it needs --no-sandbox); check once, quickly.
chromium_profile=$(mktemp -d)
if ! timeout 60 chromium --headless=new --no-sandbox --disable-gpu --user-data-dir="$chromium_profile" \
    --dump-dom 'data:text/html,<p>chromium-ok</p>' 2>/dev/null | grep -q chromium-ok; then
  echo "test.sh: chromium is installed but does not run headless" >&2; rm -rf "$chromium_profile"; exit 1
fi
rm -rf "$chromium_profile"

# Debian starts an etcd service when etcd-server is installed; the tests start their own on free
# ports, so a system one is harmless, but stop it where we can to keep the machine quiet.
if command -v systemctl >/dev/null 2>&1; then systemctl stop etcd >/dev/null 2>&1 || true; fi

cargo test --workspace --all-targets --no-fail-fast "$@"
# Where cargo put what it built (CARGO_TARGET_DIR, as a clone sharing a target dir sets it).
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
case $target_dir in /*) ;; *) target_dir=$PWD/$target_dir ;; esac

# The deterministic simulator over a fixed set of seeds (docs/testing.md), in release: whole
# clusters in one thread with seeded faults, every promise checked. A failure prints its seed and
# trace; the seed replays with `cargo run --release -p leasehold-sim -- --seed S --trace`.
cargo run --release -q -p leasehold-sim -- --seeds 1..200 --failures-file "$target_dir/sim-failures.txt" | grep -v ': ok, trace'

# Go's etcd client against leasehold and etcd 3.7, then kube-apiserver on both. Both use the
# debug binary the tests above built.
source scripts/lib/go-tools.sh
find_go
leasehold_bin="$target_dir/debug/leasehold"
etcd37=$(etcd37_bin)
(cd go/clientv3 && LEASEHOLD_BIN="$leasehold_bin" ETCD37_BIN="$etcd37" go test -count=1 ./...)
LEASEHOLD_BIN="$leasehold_bin" ./scripts/k8s-check.sh
# A whole control plane (kube-controller-manager, kube-scheduler and kwok's fake nodes) on each
# store, small: every phase must finish and the final state must be right on both. The large runs
# are benchmarks, by hand (docs/kubernetes.md).
# (Bounded: a hang is a failure, and the driver kills what it started on the SIGTERM.)
LEASEHOLD_BIN="$leasehold_bin" timeout 1800 ./scripts/k8s-scale.sh --nodes 50 --pods 500 \
  --targets "leasehold:1 etcd:1" --compaction-interval 10 --check

# etcd's own end-to-end suite, tests/common of go.etcd.io/etcd/tests/v3 at the release
# go/tools/etcd-tests pins, with the leasehold binary as `etcd` beside etcdctl 3.7 (built from the
# module proxy like the tools above). Every test must pass or be skipped, as on etcd 3.7
# (`scripts/etcd-e2e.sh --suite common` prints both side by side); a failure is tried once more.
LEASEHOLD_BIN="$leasehold_bin" ./scripts/etcd-e2e.sh --suite common --targets leasehold --retries 1
# And the tests of its tests/e2e that scripts/etcd-e2e-ci.txt lists (those that pass here in
# seconds; the whole suite takes over an hour and runs by hand, docs/testing.md).
LEASEHOLD_BIN="$leasehold_bin" ./scripts/etcd-e2e.sh --suite e2e --targets leasehold --retries 1 \
  --list scripts/etcd-e2e-ci.txt
