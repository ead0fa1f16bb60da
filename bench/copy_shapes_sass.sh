#!/usr/bin/env bash
# What each kernel of bench/copy_shapes.cu compiles to on sm_90: its global loads and
# stores (width, cache hints, L2 policy), shared-memory accesses, bulk copies and
# mbarrier operations, and whether it loops, read off the machine code (SASS) of the
# cubin. Static counts per kernel, not timings: they check that each variant does what
# its name says before it is timed on a GPU.
#
#   bench/copy_shapes_sass.sh [ARCH]        ARCH defaults to sm_90
#
# Needs nvcc (CUDA_HOME/bin or PATH); no GPU and no disassembler. The fields are decoded
# from the instruction words: their meaning was read off one-instruction PTX probes
# compiled by nvcc 13.0 for sm_90, and the same probes are compiled and decoded first on
# every run, so that a compiler whose encodings differ stops the script instead of
# printing wrong names.
set -euo pipefail

arch="${1:-sm_90}"
root="$(cd "$(dirname "$0")/.." && pwd)"
nvcc="$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")"
if [[ ! -x "$nvcc" ]]; then
  echo "copy_shapes_sass.sh: nvcc not found (set CUDA_HOME or PATH)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/probes.cu" <<'PROBES'
#include <cstdint>
#define PROBE(name, body) \
  extern "C" __global__ void name(const float4* x, float4* y) { body }
#define LOAD(q)                                                            \
  float4 v;                                                                \
  asm volatile("ld.global" q ".v4.f32 {%0, %1, %2, %3}, [%4];"             \
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(x));     \
  *y = v;
#define STORE(q, ...)                                                      \
  asm volatile("st.global" q ".v4.f32 [%0], {%1, %2, %3, %4}" __VA_ARGS__ \
               :: "l"(y), "f"(1.f), "f"(2.f), "f"(3.f), "f"(4.f), "l"(p) : "memory");
PROBE(probe_ld, LOAD(""))
PROBE(probe_ld_nc, LOAD(".nc"))
PROBE(probe_ld_L1_no_allocate, LOAD(".L1::no_allocate"))
PROBE(probe_ld_L1_evict_first, LOAD(".L1::evict_first"))
PROBE(probe_ld_L2_256B, LOAD(".L2::256B"))
PROBE(probe_st, uint64_t p = 0; STORE("", ";"))
PROBE(probe_st_L1_no_allocate, uint64_t p = 0; STORE(".L1::no_allocate", ";"))
PROBE(probe_st_L2_cache_hint, uint64_t p;
      asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
      STORE(".L2::cache_hint", ", %5;"))
__shared__ __align__(128) float4 tile[256];
__shared__ uint64_t barrier;
PROBE(probe_bulk,
      const uint32_t t = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
      const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&barrier));
      uint32_t done;
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 4096;" :: "r"(b) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                   " [%0], [%1], 4096, [%2];" :: "r"(t), "l"(x), "r"(b) : "memory");
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;"
                   " selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(b) : "memory");
      float4 v = tile[threadIdx.x];
      v.x += done; v.y += done; v.z += done; v.w += done;
      tile[threadIdx.x] = v;
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 4096;"
                   :: "l"(y), "r"(t) : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");)
PROBES
"$nvcc" -O3 -std=c++17 -arch="$arch" -cubin "$work/probes.cu" -o "$work/probes.cubin"
# The flags of the gpucompute-copy-shapes target (bench/CMakeLists.txt), for one
# architecture.
"$nvcc" -O3 -std=c++17 -Xptxas=-O3 -arch="$arch" -cubin "$root/bench/copy_shapes.cu" \
  -o "$work/copy_shapes.cubin"

PYTHONPATH="$root/bench" python3 - "$work/probes.cubin" "$work/copy_shapes.cubin" <<'EOF'
import collections
import re
import sys

from cubin_text import kernels


# Opcodes: the low 9 bits name the instruction (the bits above them select operand
# forms), except where 12 bits are needed to tell two apart. Values as nvcc 13.0 emits
# them for sm_90.
LDG, STG, LDS, STS, ULDC, BRA = 0x181, 0x186, 0x184, 0x188, 0x0B9, 0x147
UBLKCP, DEPBAR = 0x1BA, 0x11A
POLICY_MOVE = 0xC82  # (12 bits) writes createpolicy's result to the store's descriptor
OTHER = {  # 12 bits
    0x5B2: "SYNCS.EXCH.64 (mbarrier.init)",
    0x9A7: "SYNCS.ARRIVE.TRANS64 (mbarrier.arrive.expect_tx)",
    0x5A7: "SYNCS.PHASECHK.TRANS64.TRYWAIT (mbarrier.try_wait)",
    0x9B7: "UTMACMDFLUSH (cp.async.bulk.commit_group)",
    0x3C6: "FENCE.VIEW.ASYNC.S (fence.proxy.async)",
}
SIZES = {4: "", 5: ".64", 6: ".128"}
EVICT = {0: ".EF", 1: "", 2: ".EL", 5: ".NA"}  # L1 eviction priority
PREFETCH = {0: "", 1: ".LTC64B", 2: ".LTC128B", 3: ".LTC256B"}  # L2 prefetch size
DEFAULT_DESCRIPTOR = 0x208  # c[0x0][0x208]: the memory descriptor without a policy


def describe(code):
    """Counts of the memory, bulk-copy and barrier instructions of one kernel, by name."""
    counts = collections.Counter()
    # What each uniform register holds, in program order: a constant-bank word that
    # ULDC loaded (the default memory descriptor among them) or a createpolicy result.
    # A store's L2 policy is its memory descriptor. Kernels set their descriptors once,
    # before any loop, so program order is the order that matters.
    holds = {}
    loops = 0
    for at, lo, hi in code:
        op, op12 = lo & 0x1FF, lo & 0xFFF
        if op == ULDC:
            holds[lo >> 16 & 0xFF] = (lo >> 40 & 0xFFFF) * 4
        elif op12 == POLICY_MOVE:
            holds[lo >> 16 & 0xFF] = "policy"
        if op == LDG:
            sem = ".CONSTANT" if hi >> 13 & 0xF == 4 else ""
            counts["LDG.E%s%s%s%s" % (EVICT.get(hi >> 20 & 7, "?"), PREFETCH[hi >> 4 & 3],
                                      SIZES.get(hi >> 9 & 7, "?"), sem)] += 1
        elif op == STG:
            descriptor = holds.get(hi & 0x3F)
            source = {DEFAULT_DESCRIPTOR: "", "policy": " desc=policy"}.get(descriptor, " desc=?")
            counts["STG.E%s%s%s" % (EVICT.get(hi >> 20 & 7, "?"), SIZES.get(hi >> 9 & 7, "?"),
                                    source)] += 1
        elif op in (LDS, STS):
            counts["%s%s" % ("LDS" if op == LDS else "STS", SIZES.get(hi >> 9 & 7, "?"))] += 1
        elif op == UBLKCP:
            counts["UBLKCP" + {1: ".S.G (global to shared)",
                               2: ".G.S (shared to global)"}.get(hi >> 9 & 3, ".?")] += 1
        elif op == DEPBAR:
            counts["DEPBAR.LE SB0, %d (cp.async.bulk.wait_group)" % (lo >> 38 & 0x3F)] += 1
        elif op12 in OTHER:
            counts[OTHER[op12]] += 1
        elif op == BRA:  # backward branches other than the final self-loop
            offset = ((hi << 64 | lo) >> 34) & ((1 << 48) - 1)
            offset = (offset - (1 << 48) if offset >> 47 else offset) << 8 | (lo >> 16 & 0xFF)
            target = at + 16 + 4 * offset
            loops += target < at
    return counts, loops


probes = {name: describe(code)[0] for name, code in kernels(sys.argv[1]).items()}
expected = [
    ("probe_ld", "LDG.E.128"),
    ("probe_ld_nc", "LDG.E.128.CONSTANT"),
    ("probe_ld_L1_no_allocate", "LDG.E.NA.128"),
    ("probe_ld_L1_evict_first", "LDG.E.EF.128"),
    ("probe_ld_L2_256B", "LDG.E.LTC256B.128"),
    ("probe_st", "STG.E.128"),
    ("probe_st_L1_no_allocate", "STG.E.NA.128"),
    ("probe_st_L2_cache_hint", "STG.E.128 desc=policy"),
] + [("probe_bulk", name) for name in list(OTHER.values()) + [
    "UBLKCP.S.G (global to shared)", "UBLKCP.G.S (shared to global)",
    "DEPBAR.LE SB0, 1 (cp.async.bulk.wait_group)", "LDS.128", "STS.128"]]
for name, want in expected:
    if want not in probes[name]:
        sys.exit("copy_shapes_sass.sh: this compiler's encodings differ from nvcc 13.0's "
                 "(probe %s decodes to %s, without %s)" % (name, sorted(probes[name]), want))

ARGS = {"Op": {"0": "copy", "1": "x - c"},
        "LoadHint": {"0": "ld plain", "1": "ld.nc.L1::no_allocate.L2::256B"},
        "StoreHint": {"0": "st plain", "1": "st.L1::no_allocate", "2": "st.L2::cache_hint"}}
for name, code in kernels(sys.argv[2]).items():
    m = re.search(r"(GridStride|OneShot|BulkPipeline)KernelI(.*)EEvPKf", name)
    if not m:
        continue
    args = []
    for kind, value in re.findall(r"L(?:NS_\d+(\w+?)E|i)(\d+)E", m.group(2)):
        args.append(ARGS[kind][value] if kind else value)
    counts, loops = describe(code)
    print("%s<%s>%s" % (m.group(1), ", ".join(args), ", loops" if loops else ", no loop"))
    for what, count in sorted(counts.items()):
        print("    %3d x %s" % (count, what))
EOF
