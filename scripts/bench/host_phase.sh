#!/usr/bin/env bash
# Which phase a shared host is in, sampled N times: the read bandwidth of 1 and 2 threads and
# the one-token matmul's streaming rate (`examples/packed_stream`, GB/s), beside what an empty
# 2-task call of the kernel pool costs (`examples/pool_latency`, ns, three rounds). On the Zen 4
# VMs of issue #48 the host moves between a phase where two threads read ~33 GB/s and an empty
# call costs ~380 ns, and one where they read ~48 GB/s and it costs ~1,250 ns (the vCPUs far
# apart): decode-bound figures need the phase they ran in.
#
#   scripts/bench/host_phase.sh [N] [PAUSE_S]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-6}; pause=${2:-5}
cargo build --release -q -p model --example packed_stream
cargo build --release -q -p kernels --example pool_latency
for ((i = 0; i < n; i++)); do
  p=$(target/release/examples/packed_stream 2>&1 | awk '/plain/{printf "plain%s %s ", $1, $(NF-1)} /streaming/{printf "stream%s %s ", $1, $(NF-5)}')
  l=$(target/release/examples/pool_latency 50000 2>&1 | awk '{print $(NF-1)}' | tr '\n' ' ')
  echo "$(date -u +%H:%M:%S) $p| empty call ns: $l"
  sleep "$pause"
done
