#!/bin/bash
# How long the server takes to stop on SIGTERM with long work queued on four streams, an
# idle gRPC channel and an idle TCP connection open, and a named buffer to persist. Prints
# one table row per run: the wall time from the signal to the exit, against the grace.
#
# usage: bench/shutdown_bound.sh [--backend=cpu|cuda] [--grace=2s] [--log2n=24] [--ops=40] [--runs=3]
# Tune --log2n and --ops so that the work queued outlasts the grace.
# Programs: $GPUCOMPUTE_SERVER_BIN and $GPUCOMPUTE_CLI_BIN, else those of build/.
set -euo pipefail

backend=cpu grace=2s log2n=24 ops=40 runs=3
for arg in "$@"; do
  case $arg in
    --backend=*) backend=${arg#*=} ;;
    --grace=*) grace=${arg#*=} ;;
    --log2n=*) log2n=${arg#*=} ;;
    --ops=*) ops=${arg#*=} ;;
    --runs=*) runs=${arg#*=} ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
server=${GPUCOMPUTE_SERVER_BIN:-build/server/gpucompute-server}
cli=${GPUCOMPUTE_CLI_BIN:-build/client/gpucompute}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# A long elementwise kernel: transcendental functions in float64, so that each operation
# is bound by arithmetic rather than by memory.
expr='sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x)) * tanh(x)))) + cos(exp(sin(x))) * log(abs(x) + 1)'
for s in 1 2 3 4; do
  for ((i = 0; i < ops; i++)); do echo "eval '$expr' x=x --out y$s"; done > "$work/stream$s.ops"
done

printf '%-8s %-6s %-8s %-10s %-10s %-9s %-12s %s\n' backend grace ops/strm "queued s" "exit s" \
  cancelled "snapshot" "server says"
for ((run = 1; run <= runs; run++)); do
  rm -rf "$work/persist" && mkdir -p "$work/persist"
  "$server" --backend="$backend" --listen=127.0.0.1:0 --shutdown-grace="$grace" \
    --persist-dir="$work/persist" 2> "$work/server.log" &
  pid=$!
  port=
  for _ in $(seq 300); do
    port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$work/server.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$work/server.log" >&2; exit 1; }
  g=("$cli" --server "127.0.0.1:$port")
  "${g[@]}" create --shape $((1 << log2n)) --dtype float64 --name x > /dev/null
  "${g[@]}" rand uniform --out x > /dev/null
  streams=()
  for s in 1 2 3 4; do
    streams+=("$("${g[@]}" stream create | awk '{ print $1 }')")
    "${g[@]}" create --shape $((1 << log2n)) --dtype float64 --name "y$s" > /dev/null
  done
  # Idle connections: a TCP connection that sends nothing, and an HTTP/2 one with no call.
  exec 3<> "/dev/tcp/127.0.0.1/$port"
  # The channel: an HTTP/2 connection, its preface and settings sent, then nothing.
  python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $port))
s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
time.sleep(600)" &
  idle_channel=$!
  for s in 1 2 3 4; do
    "${g[@]}" --stream "${streams[s - 1]}" run "$work/stream$s.ops" > "$work/run$s.log" 2>&1 &
  done
  queued_at=$(date +%s.%N)
  sleep 2  # the runs' sessions send their operations, and the device starts on them
  start=$(date +%s.%N)
  kill -TERM $pid
  wait $pid || true
  end=$(date +%s.%N)
  exec 3<&- 3>&-
  kill $idle_channel 2>/dev/null || true
  wait 2>/dev/null || true
  cancelled=$(sed -n 's/.*\b\([0-9][0-9]*\) queued operations did not start.*/\1/p' "$work/server.log" | head -1 || true)
  snapshot=$(sed -n 's/.*wrote [0-9]* named buffers to .* in \([^ ",]*\).*/\1/p' "$work/server.log" | head -1 || true)
  shut=$(grep '"shut down"' "$work/server.log" | sed -n 's/.*"took":"\([^"]*\)".*/\1/p' | tail -1 || true)
  printf '%-8s %-6s %-8s %-10.2f %-10.2f %-9s %-12s %s\n' "$backend" "$grace" "$ops" \
    "$(awk "BEGIN { print $start - $queued_at }")" "$(awk "BEGIN { print $end - $start }")" "${cancelled:-0}" \
    "${snapshot:--}" "$shut"
done
