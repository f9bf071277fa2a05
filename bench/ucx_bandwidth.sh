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

p=$(port)
"$here/build/bench/atoll-bench-ucx" --node-rank 1 --nnodes 2 --master-port "$p" --max-mib "$max_mib" &
atoll=$("$here/build/bench/atoll-bench-ucx" --node-rank 0 --nnodes 2 --master-port "$p" --max-mib "$max_mib")
wait

echo "size      all_gather MB/s  reduce_scatter MB/s  ucx_perftest tag_bw MB/s  ratios (ag, rs)"
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
  ag=$(echo "$atoll" | awk -v m="$mib" '$2 == "all_gather" && $3 == m {print $7}')
  rs=$(echo "$atoll" | awk -v m="$mib" '$2 == "reduce_scatter" && $3 == m {print $7}')
  printf "%3d MiB   %15s  %19s  %24s  %s, %s\n" "$mib" "$ag" "$rs" "$tag" \
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
"$here/scripts/launch" --nnodes 2 -- "$here/configs/beam-small.yaml" "${common[@]}" --set run_dir="$tmp/ucx" > /dev/null 2>&1
sim=$(step_time "$tmp/sim/metrics.jsonl")
ucx=$(step_time "$tmp/ucx/metrics.jsonl")
echo "beam-small step (dp_shard 4): sim 4 ranks in one process ${sim} s, ucx 2 processes x 2 ranks ${ucx} s," \
  "ratio $(awk -v a="$ucx" -v b="$sim" 'BEGIN {printf "%.3f", a / b}')"
