#!/usr/bin/env bash
# Instructions per output byte of each random-fill kernel's main loop, read off the
# sm_90 machine code (SASS) of kernels/cuda/random.cu. Static counts, not timings: they
# say how much a loop iteration asks of the issue slots, which is what bounds the normal
# fills (kernels/PERFORMANCE.md turns them into a budget).
#
#   bench/random_sass.sh [ARCH]        ARCH defaults to sm_90
#
# Needs nvcc and cuobjdump (CUDA_HOME/bin or PATH); no GPU. For every RandomKernel it
# finds the loop that holds the vector store (a backward branch and its target), counts
# the instructions in it (NOPs aside), and divides by the bytes that loop stores.
set -euo pipefail

arch="${1:-sm_90}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda_bin="${CUDA_HOME:-/usr/local/cuda}/bin"
nvcc="$(command -v nvcc || echo "$cuda_bin/nvcc")"
cuobjdump="$(command -v cuobjdump || echo "$cuda_bin/cuobjdump")"
for tool in "$nvcc" "$cuobjdump"; do
  if [[ ! -x "$tool" ]]; then
    echo "random_sass.sh: $(basename "$tool") not found (set CUDA_HOME or PATH)" >&2
    exit 1
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The flags of the library build (kernels/CMakeLists.txt), for one architecture.
"$nvcc" -O2 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -arch="$arch" -cubin \
  -I"$root" "$root/kernels/cuda/random.cu" -o "$work/random.cubin"
"$cuobjdump" -sass "$work/random.cubin" >"$work/random.sass"

python3 - "$work/random.sass" <<'EOF'
import re
import sys

# Kernel template arguments as mangled: element type, distribution, normal transform.
TYPES = {"f": "float32", "d": "float64", "i": "int32", "l": "int64"}
DISTRIBUTIONS = {"0": "uniform", "1": "normal", "2": "integers"}

kernels = {}
name = None
for line in open(sys.argv[1]):
    m = re.match(r"\s*Function : (\S+)", line)
    if m:
        name = m.group(1)
        kernels[name] = []
        continue
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m and name is not None:
        kernels[name].append((int(m.group(1), 16), m.group(2).strip()))

rows = []
for name, code in kernels.items():
    m = re.search(r"RandomKernelI([fdil])LNS_12DistributionE(\d)E(?:LNS_15NormalTransformE(\d)E)?",
                  name)
    if not m:
        continue
    # Builds before the transform was a template argument had v1 only.
    dtype, dist, transform = TYPES[m.group(1)], DISTRIBUTIONS[m.group(2)], m.group(3) or "1"
    label = f"{dist} v{transform}" if dist == "normal" else dist
    # One Philox block is 16 bytes, 8 for int32: its store is STG.E.128 or STG.E.64.
    width = 8 if dtype == "int32" else 16
    store = re.compile(r"\bSTG\.E\.%d\b" % (8 * width))
    best = None
    for address, text in code:
        b = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not b or int(b.group(1), 16) >= address:
            continue
        body = [t for a, t in code if int(b.group(1), 16) <= a <= address]
        stores = [t for t in body if store.search(t)]
        if stores and (best is None or len(body) < len(best[0])):
            best = (body, stores)
    if best is None:
        rows.append((dtype, label, None, 0, 0, 0))
        continue
    body, stores = best
    body = [t for t in body if not t.startswith("NOP")]
    stored = width * len(stores)
    fp64 = sum(1 for t in body if re.match(r"(@!?U?P\d+\s+)?D(FMA|MUL|ADD)\b", t))
    rows.append((dtype, label, len(body), stored, fp64, len(body) / stored))

print(f"{'kernel':<22} {'loop instructions':>17} {'bytes stored':>12} {'of them FP64':>12}"
      f" {'instructions/byte':>17}")
for dtype, label, count, stored, fp64, per_byte in sorted(rows):
    if count is None:
        print(f"{label + ' ' + dtype:<22} {'(no vector-store loop found)':>17}")
        continue
    print(f"{label + ' ' + dtype:<22} {count:>17} {stored:>12} {fp64:>12} {per_byte:>17.2f}")
EOF
