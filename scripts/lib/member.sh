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
# proxy: the caller sources go-tools.sh), leasehold ($bin, with $LEASEHOLD_ARGS added) or
# leasehold_before (another leasehold binary, $LEASEHOLD_BEFORE_BIN: a change measured against the
# build before it in the same run).
run_server() {
  local target=$1 log=$2 etcd37
  shift 2
  case $target in
    etcd) etcd "$@" >>"$log" 2>&1 & ;;
    # Found (or built, the first time) before the server goes to the background, so members
    # started one after another never build it at once.
    etcd37) etcd37=$(etcd37_bin); "$etcd37" "$@" >>"$log" 2>&1 & ;;
    # shellcheck disable=SC2086 # LEASEHOLD_ARGS is a list of flags
    leasehold) LEASEHOLD_LOG=warn "$bin" "$@" ${LEASEHOLD_ARGS:-} >>"$log" 2>&1 & ;;
    # shellcheck disable=SC2086
    leasehold_before) LEASEHOLD_LOG=warn "${LEASEHOLD_BEFORE_BIN:?set LEASEHOLD_BEFORE_BIN}" "$@" ${LEASEHOLD_ARGS:-} >>"$log" 2>&1 & ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
  pid=$!
}

# three_members TARGET: free loopback ports for TARGET's members 0-2 in the caller's associative
# arrays client[TARGETi] and peer[TARGETi], and their --initial-cluster in cluster[TARGET]
# (free_port is ports.sh's).
three_members() {
  local target=$1 c="" i
  for i in 0 1 2; do
    client[$target$i]=$(free_port); peer[$target$i]=$(free_port)
    c+="${c:+,}m$i=http://127.0.0.1:${peer[$target$i]}"
  done
  cluster[$target]=$c
}

# ready ENDPOINT SECONDS: polls a linearizable read every 5 ms until it answers (at most SECONDS).
ready() {
  local stop=$(( $(now_ns) + $2 * 1000000000 ))
  until "$bin" get --endpoints "$1" --dial-timeout 1s --command-timeout 2s ready-probe >/dev/null 2>&1; do
    [ "$(now_ns)" -lt "$stop" ] || { echo "no answer from $1" >&2; return 1; }
    sleep 0.005
  done
}

# The comparison scripts keep every server up for the whole run and measure one target at a
# time. While one is measured, pause_others TARGET stops (SIGSTOP) every member of the other
# targets and resume_all resumes them: on 2 cores another server's background work (an etcd
# cluster revoking thousands of expired leases takes ~16 s) otherwise lands in the measured
# one's figures. Callers list the targets in $targets and each target's member pids in the
# associative array target_pids ("pid pid ..."). PAUSE_OTHERS=0 keeps them all running.
pause_others() {
  [ "${PAUSE_OTHERS:-1}" = 0 ] && return
  local t
  for t in "${targets[@]}"; do
    # shellcheck disable=SC2086 # a list of pids
    [ "$t" = "$1" ] || kill -STOP ${target_pids[$t]} 2>/dev/null || true
  done
}
resume_all() {
  local t
  # shellcheck disable=SC2086 # a list of pids
  for t in "${targets[@]}"; do kill -CONT ${target_pids[$t]} 2>/dev/null || true; done
}

# stop_servers PID...: resumes (a paused server would hold its SIGTERM) and stops each.
stop_servers() {
  local p
  for p in "$@"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
}
