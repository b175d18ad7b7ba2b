#!/usr/bin/env bash
# Runs leasehold's whole test suite. First installs what the tests need when it is missing:
#   etcd + etcdctl (Debian's etcd-server, etcd-client): the differential tests run a real etcd;
#   protoc (Debian's protobuf-compiler) and the well-known .proto files it imports
#   (Debian's libprotobuf-dev, /usr/include/google/protobuf/descriptor.proto): the etcd-client
#   crate used by the tests needs both to build;
#   curl: the HTTP endpoint tests read /health, /livez, /readyz and /version with it.
# The leasehold binary itself builds with cargo alone.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v curl >/dev/null 2>&1 || missing+=(curl)
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
for need in etcd etcdctl protoc curl; do
  command -v "$need" >/dev/null 2>&1 || { echo "test.sh: $need is still missing after install" >&2; exit 1; }
done
[ -f /usr/include/google/protobuf/descriptor.proto ] ||
  { echo "test.sh: google/protobuf/descriptor.proto is still missing after install" >&2; exit 1; }

# Debian starts an etcd service when etcd-server is installed; the tests start their own on free
# ports, so a system one is harmless, but stop it where we can to keep the machine quiet.
if command -v systemctl >/dev/null 2>&1; then systemctl stop etcd >/dev/null 2>&1 || true; fi

cargo test --workspace --all-targets "$@"
