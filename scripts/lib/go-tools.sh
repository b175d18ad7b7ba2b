# Sourced by scripts that need programs built from the Go module proxy: etcd 3.7 and etcdctl
# (go/tools/etcd), kube-apiserver, kubectl, kube-controller-manager and kube-scheduler
# (go/tools/kubernetes), and kwok, which fakes nodes and their pods (go/tools/kwok).
#
# Each directory under go/tools is a wrapper module: its go.mod requires the published module and
# pins every module that the published go.mod replaces with a local path (which is why
# `go install pkg@version` refuses them), and its go.sum pins every download. A program is built
# once per wrapper content into $LEASEHOLD_TOOLS_CACHE (default ~/.cache/leasehold-tools),
# outside the repository, so a second run builds nothing.

tools_cache="${LEASEHOLD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold-tools}"
# The Go fetched when the machine has none: the Go project publishes every release on the module
# proxy as the module golang.org/toolchain, which is where the go command itself fetches one.
fallback_go=1.26.8

# find_go: puts a Go toolchain on PATH: the machine's, /usr/local/go's, or else Go
# $fallback_go fetched once from the module proxy into the tools cache (or stops, exit 2).
# The wrappers say `go 1.26.0`; an older go command (1.21 or newer) fetches that toolchain from
# the module proxy by itself (GOTOOLCHAIN=auto).
find_go() {
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
  fi
  command -v go >/dev/null 2>&1 && return
  local root="$tools_cache/go$fallback_go"
  [ -x "$root/bin/go" ] || fetch_go "$root" ||
    { echo "go not found, and Go $fallback_go could not be fetched: install Go 1.26 or newer" >&2; exit 2; }
  export PATH="$PATH:$root/bin"
}

# fetch_go DIR: Go $fallback_go for this machine, from the module proxy, unpacked into DIR.
fetch_go() {
  local dir=$1 arch tmp
  case $(uname -m) in
    x86_64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) echo "no Go download known for $(uname -m)" >&2; return 1 ;;
  esac
  local version="v0.0.1-go$fallback_go.linux-$arch"
  echo "go not found: fetching Go $fallback_go (golang.org/toolchain@$version) into $dir" >&2
  tmp=$(mktemp -d)
  curl -fsSL --retry 3 -o "$tmp/go.zip" "https://proxy.golang.org/golang.org/toolchain/@v/$version.zip" &&
    python3 -m zipfile -e "$tmp/go.zip" "$tmp/x" || { rm -rf "$tmp"; return 1; }
  # zipfile drops the executable bits: the programs are bin/* and pkg/tool/*/*.
  local unpacked="$tmp/x/golang.org/toolchain@$version"
  chmod +x "$unpacked"/bin/* "$unpacked"/pkg/tool/*/*
  mkdir -p "$(dirname "$dir")" && rm -rf "$dir" && mv "$unpacked" "$dir"
  rm -rf "$tmp"
  "$dir/bin/go" version >&2
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
  out="$tools_cache/$wrapper-$key"
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
kube_controller_manager_bin() { go_tool kubernetes k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager; }
kube_scheduler_bin() { go_tool kubernetes k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler; }
kwok_bin() { go_tool kwok sigs.k8s.io/kwok/cmd/kwok kwok; }
