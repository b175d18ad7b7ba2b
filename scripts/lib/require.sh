# Sourced by the bench scripts that run etcd beside leasehold: the release binary, etcd and
# etcdctl must be there, or the script stops (exit 2) saying how to get them.
require_release_and_etcd() {
  [ -x ./target/release/leasehold ] || { echo "build first: cargo build --release -p leasehold" >&2; exit 2; }
  command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 2; }
  command -v etcdctl >/dev/null || { echo "etcdctl not found (apt-get install etcd-client)" >&2; exit 2; }
}
