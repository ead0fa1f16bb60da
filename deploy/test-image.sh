#!/usr/bin/env bash
# Builds the CPU image (deploy/Dockerfile) and tries it with podman as an operator would:
# read-only, every capability dropped, under a memory and CPU limit; drives a workload
# through the CLI from the host; checks the user, the limits the server derives from the
# container, a request beyond them, the metrics endpoint, the health check and how fast
# `podman stop` ends it; prints the image's size.
#
#   bash deploy/test-image.sh [CLI]     CLI: the host's gpucompute (default build/client/gpucompute)
#
# Slow (a full image build: about 10 minutes on 2 cores). Exit 0 when every check
# passes, 1 when one fails, 77 (skipped, with the reason) when podman cannot build or
# run images here. Environment: GPUCOMPUTE_IMAGE (default localhost/gpucompute:cpu-test),
# MEMORY (default 2g), CPUS (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."

image=${GPUCOMPUTE_IMAGE:-localhost/gpucompute:cpu-test}
memory=${MEMORY:-2g}
cpus=${CPUS:-1}
cli=$(realpath "${1:-build/client/gpucompute}" 2>/dev/null || true)
name=gpucompute-test-$$
work=$(mktemp -d)
passed=0
failed=0

skip() { echo "SKIPPED: $*"; exit 77; }
ok() { echo "ok    $*"; passed=$((passed + 1)); }
fail() { echo "FAIL  $*"; failed=$((failed + 1)); }
check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }
cleanup() {
  podman rm -f -t 0 "$name" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

command -v podman >/dev/null || skip "podman is not installed (deploy/install-deps.sh --image-tools installs it)"
podman info >/dev/null 2>"$work/err" || skip "podman does not work here: $(tail -3 "$work/err")"
[ -x "$cli" ] || { echo "no CLI at ${1:-build/client/gpucompute}: build the gpucompute target first" >&2; exit 1; }
base=docker.io/library/debian:bookworm
for b in "$base" "$base-slim"; do
  podman image exists "$b" || podman pull -q "$b" >/dev/null 2>"$work/err" ||
    skip "the base image $b is not here and cannot be pulled: $(tail -1 "$work/err")"
done

# Can podman start a container here at all? Asked of the base image before the build
# (minutes on 2 cores), so that a machine that cannot run one is told at once.
if ! podman run --rm --pull=never --entrypoint /bin/true "$base-slim" 2>"$work/err"; then
  hint=""
  grep -q "RLIMIT" "$work/err" &&
    hint=" (podman's default ulimits exceed this machine's hard limits: set default_ulimits = [] under [containers] in containers.conf, e.g. through CONTAINERS_CONF)"
  grep -q "hybrid mode" "$work/err" &&
    hint=" (crun refuses hybrid cgroups: set runtime = \"runc\" under [engine] in containers.conf)"
  skip "podman cannot run containers here: $(tail -2 "$work/err")$hint"
fi

echo "# building $image"
start=$(now)
# The docker format keeps the HEALTHCHECK (OCI images have none).
if ! podman build --format docker --layers -f deploy/Dockerfile -t "$image" \
     --build-arg REVISION="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" . >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log"
  fail "the image builds"
  echo "$passed passed, $failed failed"
  exit 1
fi
ok "the image builds ($(elapsed "$start" "$(now)") s)"
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "# image size: $((size / 1000000)) MB ($size bytes)"
check "OCI labels" test "$(podman image inspect --format '{{index .Labels "org.opencontainers.image.title"}}' "$image")" = gpucompute
check "a HEALTHCHECK" bash -c "podman image inspect --format '{{.HealthCheck}}' '$image' | grep -q backend_error"

# The image itself starts a process.
podman run --rm --entrypoint /bin/true "$image" 2>"$work/err" ||
  { tail -2 "$work/err"; fail "the image runs /bin/true"; echo "$passed passed, $failed failed"; exit 1; }

echo "# running it: read-only, capabilities dropped, --memory=$memory --cpus=$cpus"
# (podman's complaints about systemd timers for the health check go to podman.err: the
# check itself is run by hand below.)
start=$(now)
podman run -d --name "$name" --read-only --cap-drop=ALL --security-opt=no-new-privileges \
  --memory="$memory" --memory-swap="$memory" --cpus="$cpus" \
  -p 127.0.0.1::50051 -p 127.0.0.1::9464 "$image" >/dev/null 2>>"$work/podman.err" ||
  { cat "$work/podman.err"; fail "the container starts"; exit 1; }
started=$(now)
grpc=$(podman port "$name" 50051/tcp | head -1)
metrics=$(podman port "$name" 9464/tcp | head -1)
export GPUCOMPUTE_SERVER=$grpc
healthy=""
for _ in $(seq 600); do
  if "$cli" --timeout 1 info >/dev/null 2>&1; then healthy=$(now); break; fi
  sleep 0.02
done
if [ -n "$healthy" ]; then
  ok "the server answers $(elapsed "$started" "$healthy") s after podman run returned ($(elapsed "$start" "$healthy") s after it was called)"
else
  fail "the server answers"; podman logs "$name" | tail -20
fi

gc() { "$cli" "$@"; }
check "runs as uid 65534" test "$(podman exec "$name" id -u)" = 65534
check "cannot write its root file system" \
  bash -c "! podman exec $name sh -c 'echo x > /opt/x' 2>/dev/null"

# The workload, from the host. Values are known: sum(3*2+1 over 1000) = 7000.
gc create --dtype float64 --shape 1000 --fill 2 --name x >/dev/null
gc eval 'x*3+1' x=x --name y >/dev/null
check "a workload through the CLI (sum = 7000)" bash -c "'$cli' reduce sum y | grep -q 'value 7000'"
gc rand uniform --shape 100000 --dtype float64 --seed 1 --name r >/dev/null
gc get r -o "$work/r.npy" >/dev/null
gc put "$work/r.npy" --name r2 >/dev/null
check "upload and download round trip" bash -c "'$cli' reduce sum r2 | grep -q value"

# The limits come from the container, not the host.
gc --json info >"$work/info.json"
read -r limit total units < <(python3 -c '
import json, sys
i = json.load(open(sys.argv[1]))
print(int(i["memory_limit_bytes"]), int(i["devices"][0]["total_memory_bytes"]), i["devices"][0]["compute_units"])
' "$work/info.json")
want_total=$(python3 -c "import sys; s=sys.argv[1].lower(); u={'k':2**10,'m':2**20,'g':2**30}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))" "$memory")
want_units=$(python3 -c "import math, sys; print(math.ceil(float(sys.argv[1])))" "$cpus")
check "info: device memory $total = the container's $want_total" test "$total" = "$want_total"
check "info: memory limit $limit = half of it" test "$limit" = "$((want_total / 2))"
check "info: $units compute units = --cpus=$cpus" test "$units" = "$want_units"
used_before=$(gc --json info | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_used_bytes"])')
elements=$(( (limit / 8) + 1024 ))
gc create --dtype float64 --shape "$elements" >"$work/over.out" 2>&1
status=$?
check "a buffer beyond the limit: RESOURCE_EXHAUSTED (exit 18, got $status)" test "$status" = 18
used_after=$(gc --json info | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_used_bytes"])')
check "and nothing changed (memory used $used_before -> $used_after)" test "$used_before" = "$used_after"
# Just under the limit fits, and the kernel does not kill the server for it.
gc create --dtype float64 --shape $(( (limit - used_after) / 8 - 1024 )) --fill 1 --name big >/dev/null
check "a buffer just under the limit, filled" test $? = 0
gc rm big >/dev/null
check "the server survived it" bash -c "'$cli' info >/dev/null && [ \"\$(podman inspect --format '{{.State.OOMKilled}}' $name)\" = false ]"

if command -v curl >/dev/null; then
  curl -sf "http://$metrics/metrics" >"$work/metrics.txt"
  check "metrics: memory limit" grep -qx "gpucompute_memory_limit_bytes $limit" "$work/metrics.txt"
  check "metrics: the workload's operations" \
    grep -qx 'gpucompute_operations_total{kind="elementwise",outcome="succeeded"} 1' "$work/metrics.txt"
fi
check "the image's health check passes" podman healthcheck run "$name"

start=$(now)
podman stop -t 10 "$name" >/dev/null 2>>"$work/podman.err"
stopped=$(elapsed "$start" "$(now)")
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
check "podman stop ends it in ${stopped} s (under 5 s), exit status $code" \
  python3 -c "import sys; sys.exit(not (float(sys.argv[1]) < 5 and sys.argv[2] == '0'))" "$stopped" "$code"

podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$image"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
