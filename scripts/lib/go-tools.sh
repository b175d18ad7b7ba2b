# Sourced by scripts that need programs built from the Go module proxy: etcd 3.7 and etcdctl
# (go/tools/etcd), kube-apiserver and kubectl (go/tools/kubernetes).
#
# Each directory under go/tools is a wrapper module: its go.mod requires the published module and
# pins every module that the published go.mod replaces with a local path (which is why
# `go install pkg@version` refuses them), and its go.sum pins every download. A program is built
# once per wrapper content into $LEASEHOLD_TOOLS_CACHE (default ~/.cache/leasehold-tools),
# outside the repository, so a second run builds nothing.

# find_go: puts a Go toolchain on PATH (the machine's, or /usr/local/go's), or stops (exit 2).
# The wrappers say `go 1.26.0`; an older go command (1.21 or newer) fetches that toolchain from
# the module proxy by itself (GOTOOLCHAIN=auto).
find_go() {
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
  fi
  command -v go >/dev/null 2>&1 ||
    { echo "go not found: install Go 1.26 or newer (https://go.dev/dl/), or put it on PATH" >&2; exit 2; }
}

# go_tool WRAPPER PACKAGE NAME: prints the path of program NAME, built from PACKAGE with the
# wrapper module go/tools/WRAPPER, building it first when the cache lacks it. Build output goes
# to stderr.
go_tool() {
  local wrapper=$1 package=$2 name=$3
  local root dir key out
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  dir="$root/go/tools/$wrapper"
  [ -f "$dir/go.mod" ] || { echo "go_tool: no wrapper module at $dir" >&2; return 2; }
  find_go
  key=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-12)
  out="${LEASEHOLD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold-tools}/$wrapper-$key"
  if [ ! -x "$out/$name" ]; then
    mkdir -p "$out"
    echo "building $name from $package (wrapper go/tools/$wrapper) into $out" >&2
    local started=$SECONDS
    # -mod=readonly: the committed go.sum must already name every download.
    (cd "$dir" && go build -mod=readonly -trimpath -o "$out/$name.tmp" "$package") >&2 || return 1
    mv "$out/$name.tmp" "$out/$name"
    echo "built $name in $((SECONDS - started)) s" >&2
  fi
  echo "$out/$name"
}

etcd37_bin() { go_tool etcd go.etcd.io/etcd/server/v3 etcd; }
etcdctl37_bin() { go_tool etcd go.etcd.io/etcd/etcdctl/v3 etcdctl; }
kube_apiserver_bin() { go_tool kubernetes k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver; }
kubectl_bin() { go_tool kubernetes k8s.io/kubernetes/cmd/kubectl kubectl; }
