# Sourced by the bench and Kubernetes scripts. require_release_and_etcd: for the bench scripts that
# run etcd beside leasehold: the release binary, etcd and etcdctl must be there, or the script stops
# (exit 2) saying how to get them.
require_release_and_etcd() {
  [ -x ./target/release/leasehold ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
  command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 2; }
  command -v etcdctl >/dev/null || { echo "etcdctl not found (apt-get install etcd-client)" >&2; exit 2; }
}

# find_leasehold: sets lh_bin to $LEASEHOLD_BIN, else target/release/leasehold, else
# target/debug/leasehold (absolute), or stops (exit 2) saying how to build it. Run from the
# repository's root.
find_leasehold() {
  lh_bin=${LEASEHOLD_BIN:-}
  local candidate
  if [ -z "$lh_bin" ]; then
    for candidate in target/release/leasehold target/debug/leasehold; do
      if [ -x "$candidate" ]; then lh_bin=$(pwd)/$candidate; break; fi
    done
  fi
  [ -n "$lh_bin" ] || { echo "build first: cargo build --release -p leasehold (or set LEASEHOLD_BIN)" >&2; exit 2; }
}
