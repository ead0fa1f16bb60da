#!/usr/bin/env bash
# Instructions per output byte of each random-fill kernel's main loop, read off the
# sm_90 machine code (SASS) of kernels/cuda/random.cu. Static counts, not timings: they
# say how much a loop iteration asks of the issue slots, which is what bounds the normal
# fills (kernels/PERFORMANCE.md turns them into a budget).
#
#   bench/random_sass.sh [ARCH]        ARCH defaults to sm_90
#
# Needs nvcc (CUDA_HOME/bin or PATH), and cuobjdump where there is one; no GPU. For
# every RandomKernel it finds the loop that holds the vector store (a backward branch and
# its target), counts the instructions in it (NOPs aside), and divides by the bytes that
# loop stores. Of them it counts the FP64 ones (half rate on an H100 or H200) and the
# MUFU and conversions (an eighth).
set -euo pipefail

arch="${1:-sm_90}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda_bin="${CUDA_HOME:-/usr/local/cuda}/bin"
nvcc="$(command -v nvcc || echo "$cuda_bin/nvcc")"
cuobjdump="$(command -v cuobjdump || echo "$cuda_bin/cuobjdump")"
if [[ ! -x "$nvcc" ]]; then
  echo "random_sass.sh: nvcc not found (set CUDA_HOME or PATH)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The flags of the library build (kernels/CMakeLists.txt), for one architecture.
"$nvcc" -O2 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -arch="$arch" -cubin \
  -I"$root" "$root/kernels/cuda/random.cu" -o "$work/random.cubin"
if [[ -x "$cuobjdump" ]]; then
  "$cuobjdump" -sass "$work/random.cubin" >"$work/random.sass"
else
  # Without cuobjdump (nvcc's Python wheels ship none), read the cubin directly: just the
  # opcodes this script counts, named from the low 9 bits of each 128-bit sm_90
  # instruction, and branch targets. Checked against cuobjdump's counts for every kernel.
  echo "random_sass.sh: no cuobjdump; decoding the cubin's opcodes ($arch only)" >&2
  PYTHONPATH="$root/bench" python3 - "$work/random.cubin" >"$work/random.sass" <<'CUBIN'
import sys

from cubin_text import kernels

NAMES = {0x118: "NOP", 0x147: "BRA", 0x186: "STG", 0x28: "DMUL", 0x29: "DADD", 0x2B: "DFMA",
         0x108: "MUFU", 0x45: "I2FP", 0x105: "F2I", 0x106: "I2F", 0x110: "F2F", 0x111: "F2I",
         0x112: "I2F"}
for name, code in kernels(sys.argv[1]).items():
    print("\t\tFunction : " + name)
    for at, lo, hi in code:
        op = lo & 0x1FF
        text = NAMES.get(op, "OP_%03x" % op)
        if op == 0x147:  # signed offset in 4-byte units: bits 16-23, then 34-81
            offset = ((hi << 64 | lo) >> 34) & ((1 << 48) - 1)
            offset = (offset - (1 << 48) if offset >> 47 else offset) << 8 | (lo >> 16 & 0xFF)
            text += " 0x%04x" % (at + 16 + 4 * offset)
        elif op == 0x186:  # the store's width: 64 or 128 bits
            text += {5: ".E.64", 6: ".E.128"}.get(hi >> 9 & 7, ".E")
        print("        /*%04x*/                   %s ;" % (at, text))
CUBIN
fi

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
    v3 = re.search(r"NormalV3KernelILb([01])E", name)
    if m:
        # Builds before the transform was a template argument had v1 only.
        dtype, dist, transform = TYPES[m.group(1)], DISTRIBUTIONS[m.group(2)], m.group(3) or "1"
        label = f"{dist} v{transform}" if dist == "normal" else dist
    elif v3:  # normal v3's own float32 kernel, with and without the final fma
        dtype, label = "float32", "normal v3" + (" (0, 1)" if v3.group(1) == "1" else "")
    else:
        continue
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
        rows.append((dtype, label, None, 0, 0, 0, 0))
        continue
    body, stores = best
    body = [t for t in body if not t.startswith("NOP")]
    stored = width * len(stores)
    fp64 = sum(1 for t in body if re.match(r"(@!?U?P\d+\s+)?D(FMA|MUL|ADD)\b", t))
    slow = sum(1 for t in body if re.match(r"(@!?U?P\d+\s+)?(MUFU|I2F|F2I|F2F|I2FP)\b", t))
    rows.append((dtype, label, len(body), stored, fp64, slow, len(body) / stored))

print(f"{'kernel':<24} {'loop instructions':>17} {'bytes stored':>12} {'of them FP64':>12}"
      f" {'MUFU/convert':>12} {'instructions/byte':>17}")
for dtype, label, count, stored, fp64, slow, per_byte in sorted(rows):
    if count is None:
        print(f"{label + ' ' + dtype:<24} {'(no vector-store loop found)':>17}")
        continue
    print(f"{label + ' ' + dtype:<24} {count:>17} {stored:>12} {fp64:>12} {slow:>12}"
          f" {per_byte:>17.2f}")
EOF
