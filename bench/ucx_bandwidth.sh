#!/usr/bin/env bash
# Issue 11's transport benchmark, from one run on this machine (loopback, UCX_NET_DEVICES=lo):
#  1. atoll's UCX all-gather and reduce-scatter bus bandwidth between 2 processes, 1..64 MiB,
#     against ucx_perftest's tag bandwidth for the same message size over the same transport
#     (the ratio; goal >= 0.8);
#  2. beam-small's step time at 2 processes x 2 ranks (scripts/launch) against sim with dp_shard 4.
# Usage: bench/ucx_bandwidth.sh [MAX_MIB]   (needs build/, ucx_perftest from ucx-utils)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
max_mib="${1:-64}"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" ATOLL_JOB_TOKEN="${ATOLL_JOB_TOKEN:-bench}"
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

bench() {  # $1: peer error handling (true: tcp on one machine; false: shared memory)
  local p
  p=$(port)
  "$here/build/bench/atoll-bench-ucx" --node-rank 1 --nnodes 2 --master-port "$p" --max-mib "$max_mib" \
    --peer-errors "$1" > /dev/null &
  "$here/build/bench/atoll-bench-ucx" --node-rank 0 --nnodes 2 --master-port "$p" --max-mib "$max_mib" --peer-errors "$1"
  wait
}
atoll_on=$(bench true)
atoll_off=$(bench false)

echo "MB/s: all-gather (ag) and reduce-scatter (rs) bus bandwidth with UCX peer error handling on / off,"
echo "ucx_perftest tag_bw (shared memory), and the ratios of the 'off' columns to it"
echo "size     ag on  rs on  ag off  rs off  tag_bw   ratios (ag off, rs off)"
for ((mib = 1; mib <= max_mib; mib *= 2)); do
  # perftest: one process sends to the other; the same per-rank message as the collectives' (half
  # the buffer each way between 2 ranks).
  bytes=$((mib * 1048576 / 2))
  p=$(port)
  ucx_perftest -p "$p" > /dev/null 2>&1 &
  server=$!
  sleep 0.3
  tag=$(ucx_perftest 127.0.0.1 -p "$p" -t tag_bw -s "$bytes" -n 40 2>/dev/null | awk '/^Final:/ {print $6}')
  wait "$server" 2>/dev/null || true
  col() { echo "$1" | awk -v m="$mib" -v c="$2" '$2 == c && $3 == m {print $7}'; }
  ag_on=$(col "$atoll_on" all_gather); rs_on=$(col "$atoll_on" reduce_scatter)
  ag=$(col "$atoll_off" all_gather); rs=$(col "$atoll_off" reduce_scatter)
  printf "%3d MiB  %6.0f %6.0f  %6.0f  %6.0f  %6.0f   %s, %s\n" "$mib" "$ag_on" "$rs_on" "$ag" "$rs" "$tag" \
    "$(awk -v a="$ag" -v t="$tag" 'BEGIN {printf "%.2f", a / t}')" "$(awk -v a="$rs" -v t="$tag" 'BEGIN {printf "%.2f", a / t}')"
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
