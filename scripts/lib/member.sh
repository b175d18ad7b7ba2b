# Sourced by the bench scripts, after `bin` (the leasehold binary) and `work` (a scratch dir) are
# set.
now_ns() { date +%s%N; }

# start_member TARGET DATA_DIR NAME CLIENT_PORT PEER_PORT CLUSTER TOKEN: starts one member of
# etcd or leasehold on loopback in the background, its log in $work/TARGET.log; sets $pid.
start_member() {
  local target=$1 dir=$2 name=$3 c=$4 p=$5 cluster=$6 token=$7
  local flags=(--name "$name" --data-dir "$dir" --listen-client-urls "http://127.0.0.1:$c"
    --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p"
    --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "$cluster"
    --initial-cluster-token "$token")
  if [ "$target" = etcd ]; then
    etcd "${flags[@]}" >>"$work/$target.log" 2>&1 &
  else
    LEASEHOLD_LOG=warn "$bin" "${flags[@]}" >>"$work/$target.log" 2>&1 &
  fi
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
