#!/usr/bin/env bash
# Issue 11's transport benchmark, from one run on this machine (loopback, UCX_NET_DEVICES=lo):
#  1. atoll's UCX all-gather and reduce-scatter bus bandwidth between 2 processes, 1..64 MiB,
#     against ucx_perftest's tag bandwidth for the same message size over the same transport
#     (the ratio; goal >= 0.8), one way and both ways at once (every member of a 2-member
#     exchange sends and receives; on one 2-core machine the two directions share the cores);
#     and atoll's send/recv one way against perftest one way (the same load: the transport's
#     own efficiency);
#  2. beam-small's step time at 2 processes x 2 ranks (scripts/launch) against sim with dp_shard 4.
# Usage: bench/ucx_bandwidth.sh [MAX_MIB]   (needs build/, ucx_perftest from ucx-utils)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
max_mib="${1:-64}"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" ATOLL_JOB_TOKEN="${ATOLL_JOB_TOKEN:-bench}"
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

bench() {  # $1: peer error handling, $2: UCX_TLS ("" for UCX's choice)
  local p
  p=$(port)
  if [[ -n "$2" ]]; then local -x UCX_TLS="$2"; fi
  "$here/build/bench/atoll-bench-ucx" --node-rank 1 --nnodes 2 --master-port "$p" --max-mib "$max_mib" \
    --peer-errors "$1" > /dev/null &
  "$here/build/bench/atoll-bench-ucx" --node-rank 0 --nnodes 2 --master-port "$p" --max-mib "$max_mib" --peer-errors "$1"
  wait
}
# Three ways to run: tcp as ucx_perftest runs it (no peer error handling), tcp with peer error
# handling (atoll's default; UCX 1.13 then keeps to network transports, and its tcp is slower),
# and shared memory (peer error handling off, UCX's choice of transport).
atoll_tcp=$(bench false tcp)
atoll_peer=$(bench true "")
atoll_shm=$(bench false "")

# ucx_perftest's tag bandwidth for one message size (bytes), one way (one sender, one receiver), or
# both ways at once (two sender/receiver pairs, one per direction: the load a 2-member exchange
# puts on the machine, where every process sends and receives); MiB/s per direction (the unit of
# its "Final:" line's bandwidth column, and of atoll-bench-ucx's figures).
perftest() {  # $1: bytes, $2: 1 or 2 directions, $3: UCX_TLS ("" for UCX's choice: shared memory)
  local ports=() servers=() out
  if [[ -n "$3" ]]; then local -x UCX_TLS="$3"; fi
  for ((d = 0; d < $2; ++d)); do
    ports+=("$(port)")
    ucx_perftest -p "${ports[d]}" > /dev/null 2>&1 &
    servers+=($!)
  done
  sleep 0.3
  out=$(for p in "${ports[@]}"; do
          ucx_perftest 127.0.0.1 -p "$p" -t tag_bw -s "$1" -n "$(( $1 < 8388608 ? 400 : 60 ))" 2>/dev/null | awk '/^Final:/ {print $6}' &
        done; wait)
  wait "${servers[@]}" 2>/dev/null || true
  echo "$out" | awk '{s += $1; n += 1} END {printf "%.0f", n ? s / n : 0}'
}

echo "MiB/s: atoll's all-gather (ag) and reduce-scatter (rs) bus bandwidth between 2 processes, and its"
echo "send/recv one way (p2p: one message at a time, the collectives' per-rank message); ucx_perftest tag_bw"
echo "over the same transport with the same message, one way (1way) and both ways at once (2way, per"
echo "direction: the load of a 2-member exchange); the ratios"
declare -A perf_one perf_two
for mode in tcp peer shm; do
  case $mode in
    tcp) results=$atoll_tcp tls=tcp
         echo "-- tcp (UCX_TLS=tcp), no peer error handling: ucx_perftest's conditions --" ;;
    peer) results=$atoll_peer tls=tcp
         echo "-- peer error handling on (atoll's default; UCX picks tcp) against ucx_perftest over tcp without it --" ;;
    shm) results=$atoll_shm tls=""
         echo "-- peer error handling off, UCX's choice of transport (shared memory) --" ;;
  esac
  echo "size         ag      rs     p2p    1way    2way  p2p/1way  ag,rs/2way  ag,rs/1way"
  for ((mib = 1; mib <= max_mib; mib *= 2)); do
    # The same per-rank message as the collectives' (half the buffer each way between 2 ranks).
    bytes=$((mib * 1048576 / 2))
    col() { echo "$results" | awk -v m="$mib" -v c="$1" '$2 == c && $3 == m {print $7}'; }
    ratio() { awk -v a="$1" -v t="$2" 'BEGIN {printf "%.2f", (t > 0 ? a / t : 0)}'; }
    ag=$(col all_gather); rs=$(col reduce_scatter); p2p=$(col one_way)
    # tcp with and without peer errors compare with the same perftest figures: measured once
    key="$bytes/$tls"
    if [[ -z "${perf_one[$key]:-}" ]]; then
      perf_one[$key]=$(perftest "$bytes" 1 "$tls"); perf_two[$key]=$(perftest "$bytes" 2 "$tls")
    fi
    one=${perf_one[$key]} two=${perf_two[$key]}
    printf "%3d MiB %7.0f %7.0f %7.0f %7.0f %7.0f  %8s  %4s, %4s  %4s, %4s\n" "$mib" "$ag" "$rs" "$p2p" "$one" "$two" \
      "$(ratio "$p2p" "$one")" "$(ratio "$ag" "$two")" "$(ratio "$rs" "$two")" "$(ratio "$ag" "$one")" "$(ratio "$rs" "$one")"
  done
done

# beam-small: 2 processes x 2 ranks over UCX against the sim's 4 ranks in one process.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step_time() {  # mean seconds per step after the first, from a metrics file
  python3 -c 'import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
print((lines[-1]["elapsed_s"] - lines[0]["elapsed_s"]) / (len(lines) - 1))' "$1"
}
common=(--set topology.mesh.dp_shard=4 --set train.global_batch=16 --set train.steps=6 --set train.log_every=100)
"$here/build/apps/atoll-train" "$here/configs/beam-small.yaml" "${common[@]}" --set run_dir="$tmp/sim" > /dev/null
sim=$(step_time "$tmp/sim/metrics.jsonl")
for peer in true false; do
  "$here/scripts/launch" --nnodes 2 -- "$here/configs/beam-small.yaml" "${common[@]}" --set run_dir="$tmp/ucx_$peer" \
    --set topology.ucx_peer_errors=$peer > /dev/null 2>&1
  ucx=$(step_time "$tmp/ucx_$peer/metrics.jsonl")
  echo "beam-small step (dp_shard 4): sim 4 ranks in one process ${sim} s, ucx 2 processes x 2 ranks" \
    "(peer errors $peer) ${ucx} s, ratio $(awk -v a="$ucx" -v b="$sim" 'BEGIN {printf "%.3f", a / b}')"
done
