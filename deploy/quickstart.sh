#!/usr/bin/env bash
# Builds gpucompute, starts a server on the default backend and runs the reference
# workload through the CLI: upload once, chain operations on the resident data, then
# download. Every operation prints its device time, traffic and throughput.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target gpucompute-server gpucompute

bin=build
port=${GPUCOMPUTE_PORT:-50151}
export GPUCOMPUTE_SERVER=127.0.0.1:$port
work=$(mktemp -d)
"$bin/server/gpucompute-server" --listen="$GPUCOMPUTE_SERVER" --memory-limit=4GiB &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT

gc() { echo "\$ gpucompute $*" >&2; "$bin/client/gpucompute" "$@"; }
for _ in $(seq 50); do "$bin/client/gpucompute" info >/dev/null 2>&1 && break; sleep 0.1; done

n=$((1 << 24))
gc info
echo "# an input file: 2^24 float64 values, written as .npy"
gc rand uniform --shape $n --dtype float64 --seed 1 --name seed >/dev/null
gc get seed -o "$work/x.npy"
gc rm seed

echo "# upload once"
gc put "$work/x.npy" --name x

echo "# chain operations on the resident data"
gc eval 'sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))' x=x --name r
gc eval 'a*x + y' a=2.5 x=x y=r --name z
gc reduce sum r
gc reduce max z
gc reduce norm2 z
gc rand normal --shape 4096,4096 --dtype float64 --seed 7 --name A
gc rand uniform --shape 4096 --dtype float64 --seed 8 --name v
gc gemv A v --name Av
gc reduce norm2 Av

echo "# download the result"
gc get r -o "$work/r.npy"
gc stats
