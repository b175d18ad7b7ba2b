# Sourced by the bench scripts, after `bin` (the leasehold binary) and `work` (a scratch dir) are
# set.
now_ns() { date +%s%N; }

# start_member TARGET DATA_DIR NAME CLIENT_PORT PEER_PORT CLUSTER TOKEN: starts one member of
# etcd, etcd37 or leasehold on loopback in the background, its log in $work/TARGET.log; sets $pid.
start_member() {
  local target=$1 dir=$2 name=$3 c=$4 p=$5 cluster=$6 token=$7
  local flags=(--name "$name" --data-dir "$dir" --listen-client-urls "http://127.0.0.1:$c"
    --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p"
    --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "$cluster"
    --initial-cluster-token "$token")
  run_server "$target" "$work/$target.log" "${flags[@]}"
}

# run_server TARGET LOG FLAG...: starts one server in the background with FLAGS, its output
# appended to LOG; sets $pid. TARGET: etcd (Debian's 3.4), etcd37 (built from the Go module
# proxy: the caller sources go-tools.sh) or leasehold ($bin, with $LEASEHOLD_ARGS added).
run_server() {
  local target=$1 log=$2
  shift 2
  case $target in
    etcd) etcd "$@" >>"$log" 2>&1 & ;;
    etcd37) "$(etcd37_bin)" "$@" >>"$log" 2>&1 & ;;
    # shellcheck disable=SC2086 # LEASEHOLD_ARGS is a list of flags
    leasehold) LEASEHOLD_LOG=warn "$bin" "$@" ${LEASEHOLD_ARGS:-} >>"$log" 2>&1 & ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
  pid=$!
}

# ready ENDPOINT SECONDS: polls a linearizable read every 5 ms until it answers (at most SECONDS).
ready() {
  local stop=$(( $(now_ns) + $2 * 1000000000 ))
  until "$bin" get --endpoints "$1" --dial-timeout 1s --command-timeout 2s ready-probe >/dev/null 2>&1; do
    [ "$(now_ns)" -lt "$stop" ] || { echo "no answer from $1" >&2; return 1; }
    sleep 0.005
  done
}
