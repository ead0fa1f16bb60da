// gpucompute-copy-shapes: how close kernels of one read and one write per element come to
// the device-to-device copy, and which kernel shape closes the gap. The arrays rows of
// gpucompute-bench put `x - m` a few percent under the copy while `x + y` (two reads, one
// write) reaches it; this program times, on one float32 array of 2^log2n elements, the
// copy engine against copy and `y = x - c` kernels that differ in one thing each: the
// loop (grid-stride or one pass), the block size, the grid, cache hints, and a bulk-copy
// (TMA) pipeline through shared memory. kernels/PERFORMANCE.md says how to run it.
//
// CUDA runtime only, no project library, so that it measures nothing but these kernels.
// Every variant's output is compared bit for bit with the expected values before it is
// timed; a wrong one prints FAILED in its row and the exit status is 1. Without a CUDA
// device it prints "no CUDA device" and exits 0.
//
//   gpucompute-copy-shapes [--log2n=28] [--runs=21] [--warmups=3]

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// A failed CUDA call ends the program: later calls would fail alike, or time garbage.
#define COPY_SHAPES_CHECK(call)                                                           \
  do {                                                                                    \
    const cudaError_t status = (call);                                                    \
    if (status != cudaSuccess) {                                                          \
      std::fprintf(stderr, "copy_shapes: %s failed at %s:%d: %s (%s)\n", #call, __FILE__, \
                   __LINE__, cudaGetErrorName(status), cudaGetErrorString(status));       \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

enum class Op { kCopy, kSubtract };

// Cache hints, as inline PTX so that each reaches the machine code as written.
enum class LoadHint {
  kPlain,           // ld.global.v4.f32 (a plain C++ load, as the project's kernels do)
  kNoAllocate256B,  // ld.global.nc.L1::no_allocate.L2::256B: read-only path, no L1 line,
                    // 256-byte L2 prefetch
};
enum class StoreHint {
  kPlain,       // st.global.v4.f32
  kNoAllocate,  // st.global.L1::no_allocate
  kEvictFirst,  // st.global.L2::cache_hint with a createpolicy evict_first policy
};

constexpr float kSubtrahend = 0.375f;
// y is followed by this many guard elements, set to kPoison like y before each checked
// run: a kernel that writes past the end fails its check.
constexpr int64_t kGuard = int64_t{1} << 18;
constexpr uint32_t kPoison = 0xFFFFFFFFu;  // a NaN; cudaMemset's 0xFF bytes

// x[i]: a multiple of 1/512 in [-1024, 1024), hashed from i so that a value in the wrong
// place is seen. x - 0.375 is then exact in float32 (20 significant bits at most).
__host__ __device__ __forceinline__ float Pattern(int64_t i) {
  uint32_t h = static_cast<uint32_t>(i) ^ static_cast<uint32_t>(i >> 32) * 0x27d4eb2du;
  h *= 0x9e3779b1u;
  h ^= h >> 15;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  return static_cast<float>(static_cast<int32_t>(h & 0xfffffu) - 0x80000) * (1.0f / 512);
}

__global__ void FillKernel(float* x, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = Pattern(i);
  }
}

// Counts the elements of y[0, total) that differ, bit for bit, from Pattern (minus c for
// kSubtract) below n and from kPoison from n on, and the first such index.
__global__ void CheckKernel(const float* y, int64_t n, int64_t total, Op op, float c,
                            unsigned long long* wrong, unsigned long long* first_wrong) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t want = kPoison;
    if (i < n) want = __float_as_uint(op == Op::kSubtract ? __fsub_rn(Pattern(i), c) : Pattern(i));
    if (__float_as_uint(y[i]) != want) {
      atomicAdd(wrong, 1ull);
      atomicMin(first_wrong, static_cast<unsigned long long>(i));
    }
  }
}

// Keeps the GPU busy for `ns` nanoseconds, while the host queues a round of timed runs
// behind it: otherwise the first run of a round, on an idle GPU, would count the time
// its own launch takes to arrive after its start event.
__global__ void DelayKernel(int64_t ns) {
  uint64_t start = 0;
  uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<uint64_t>(ns));
}

template <Op kOp>
__device__ __forceinline__ float4 Apply(float4 v, float c) {
  if constexpr (kOp == Op::kSubtract) {
    v.x -= c;
    v.y -= c;
    v.z -= c;
    v.w -= c;
  }
  return v;
}

template <LoadHint kHint>
__device__ __forceinline__ float4 Load(const float4* p) {
  if constexpr (kHint == LoadHint::kPlain) {
    return *p;
  } else {
    float4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "l"(p));
    return v;
  }
}

// The L2 policy operand of kEvictFirst stores, made once per thread.
template <StoreHint kHint>
__device__ __forceinline__ uint64_t StorePolicy() {
  uint64_t policy = 0;
  if constexpr (kHint == StoreHint::kEvictFirst) {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

template <StoreHint kHint>
__device__ __forceinline__ void Store(float4* p, float4 v, uint64_t policy) {
  if constexpr (kHint == StoreHint::kPlain) {
    *p = v;
  } else if constexpr (kHint == StoreHint::kNoAllocate) {
    asm volatile("st.global.L1::no_allocate.v4.f32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
  } else {
    asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;"
                 :
                 : "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(policy)
                 : "memory");
  }
}

// Every kernel timed takes (x, y, count, c); count is in the kernel's own unit (16-byte
// packs, or tiles for the bulk pipeline), so that one launcher serves them all.
using Kernel = void (*)(const float*, float*, int64_t, float);

// The project's contiguous and rows kernels' loop: a grid-stride loop, kPacks 16-byte
// packs a thread per iteration (pack j at base + j * the grid's threads, so that at each j
// consecutive threads touch consecutive words), every load of an iteration issued before
// its math, and each pack's bounds tested. No __restrict__, as there.
template <Op kOp, int kBlock, int kPacks, LoadHint kLoad, StoreHint kStore>
__global__ void __launch_bounds__(kBlock)
    GridStrideKernel(const float* x, float* y, int64_t packs, float c) {
  const float4* in = reinterpret_cast<const float4*>(x);
  float4* out = reinterpret_cast<float4*>(y);
  const uint64_t policy = StorePolicy<kStore>();
  const int64_t first = int64_t{blockIdx.x} * kBlock + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * kBlock;
  // nvcc unrolls the plain loop 4 times by itself (as it does the project's kernels),
  // but not the loops with inline PTX: asking all for 4 keeps the hints the only
  // difference (8 packs a thread per unrolled iteration).
#pragma unroll 4
  for (int64_t base = first; base < packs; base += stride * kPacks) {
    float4 v[kPacks] = {};
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (base + j * stride < packs) v[j] = Load<kLoad>(in + base + j * stride);
    }
#pragma unroll
    for (int j = 0; j < kPacks; ++j) v[j] = Apply<kOp>(v[j], c);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (base + j * stride < packs) Store<kStore>(out + base + j * stride, v[j], policy);
    }
  }
}

// One pass, no loop and no bounds test: a block covers kBlock * kPacks consecutive packs
// (the launcher makes the grid exactly packs / (kBlock * kPacks)), and a thread loads all
// its kPacks packs, then computes, then stores them.
template <Op kOp, int kBlock, int kPacks, LoadHint kLoad, StoreHint kStore>
__global__ void __launch_bounds__(kBlock)
    OneShotKernel(const float* x, float* y, int64_t /*packs*/, float c) {
  const int64_t base = int64_t{blockIdx.x} * kBlock * kPacks + threadIdx.x;
  const float4* in = reinterpret_cast<const float4*>(x) + base;
  float4* out = reinterpret_cast<float4*>(y) + base;
  const uint64_t policy = StorePolicy<kStore>();
  float4 v[kPacks];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) v[j] = Load<kLoad>(in + j * kBlock);
#pragma unroll
  for (int j = 0; j < kPacks; ++j) v[j] = Apply<kOp>(v[j], c);
#pragma unroll
  for (int j = 0; j < kPacks; ++j) Store<kStore>(out + j * kBlock, v[j], policy);
}

// The bulk-copy (TMA) pipeline's PTX, sm_90 on. Shared-memory operands are 32-bit
// shared-window addresses; a block launched without clusters is a cluster of one, so its
// own shared::cta addresses are valid shared::cluster ones.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarrierInit(uint32_t barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(barrier), "r"(arrivals) : "memory");
}

// The barrier's one arrival for this phase, which also expects `bytes` of transactions:
// the phase completes when the bulk load has written them.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes)
               : "memory");
}

// Waits for the phase of this parity to complete; its completion makes the bulk load's
// writes to shared memory visible to the waiting thread.
__device__ __forceinline__ void MbarrierWait(uint32_t barrier, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        "  .reg .pred complete;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ void BulkLoad(uint32_t to, const void* from, uint32_t bytes,
                                         uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(to),
      "l"(from), "r"(bytes), "r"(barrier)
      : "memory");
}

__device__ __forceinline__ void BulkStore(void* to, uint32_t from, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(to), "r"(from),
               "r"(bytes)
               : "memory");
}
#endif  // __CUDA_ARCH__ >= 900

constexpr int kBulkBlock = 256;

// The bulk-copy pipeline: a persistent grid, block b taking tiles b, b + grid, ...; each
// tile (kTileBytes) is brought into one of kStages shared-memory stages by one
// cp.async.bulk with an mbarrier per stage, subtracted in place by the whole block
// (kSubtract), and written back by one cp.async.bulk from shared memory. Thread 0 issues
// every copy. After storing tile k it waits for the store of tile k - 1 to have read its
// stage (wait_group.read 1: all groups but the newest) and refills that stage with tile
// k - 1 + kStages, so kStages - 1 tiles are being loaded while one is computed.
// For kCopy only thread 0 works: the pipeline less the math and the block's barriers.
template <Op kOp, int kStages, int kTileBytes>
__global__ void __launch_bounds__(kBulkBlock)
    BulkPipelineKernel(const float* x, float* y, int64_t tiles, float c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(kTileBytes % 16 == 0 && kTileBytes < (1 << 20), "cp.async.bulk sizes");
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ __align__(8) uint64_t full[kStages];
  const bool leader = threadIdx.x == 0;
  const unsigned char* from = reinterpret_cast<const unsigned char*>(x);
  unsigned char* to = reinterpret_cast<unsigned char*>(y);
  if (leader) {
    for (int s = 0; s < kStages; ++s) MbarrierInit(SharedAddress(&full[s]), 1);
    // Makes the initialized barriers visible to the async proxy (the bulk copies).
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (kOp == Op::kCopy && !leader) return;

  // Tiles of this block: blockIdx.x + k * gridDim.x for k in [0, count).
  const int64_t step = gridDim.x;
  const int64_t count = blockIdx.x < tiles ? (tiles - blockIdx.x + step - 1) / step : 0;
  auto load = [&](int64_t k) {
    const int s = static_cast<int>(k % kStages);
    const uint32_t barrier = SharedAddress(&full[s]);
    MbarrierArriveExpectTx(barrier, kTileBytes);
    BulkLoad(SharedAddress(stages + s * kTileBytes), from + (blockIdx.x + k * step) * kTileBytes,
             kTileBytes, barrier);
  };
  if (leader) {
    for (int64_t k = 0; k < count && k < kStages; ++k) load(k);
  }
  for (int64_t k = 0; k < count; ++k) {
    const int s = static_cast<int>(k % kStages);
    MbarrierWait(SharedAddress(&full[s]), static_cast<uint32_t>((k / kStages) & 1));
    if constexpr (kOp == Op::kSubtract) {
      float4* tile = reinterpret_cast<float4*>(stages + s * kTileBytes);
#pragma unroll 4
      for (int i = threadIdx.x; i < kTileBytes / 16; i += kBulkBlock) {
        tile[i] = Apply<kOp>(tile[i], c);
      }
      // Orders this thread's shared-memory writes before the bulk store (async proxy)
      // reads them; the barrier then lets thread 0 issue it.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
    }
    if (leader) {
      BulkStore(to + (blockIdx.x + k * step) * kTileBytes, SharedAddress(stages + s * kTileBytes),
                kTileBytes);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      if (k >= 1 && k - 1 + kStages < count) {
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        load(k - 1 + kStages);
      }
    }
  }
  // The block's shared memory must outlive the stores' reads; wait for the writes too.
  if (leader) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
  __trap();  // the host launches the pipeline on compute capability 9.0 and up only
#endif
}

enum class GridKind {
  kWaves,       // the project's: 4 waves of resident blocks (ElementwiseGrid), or fewer
  kPersistent,  // exactly SMs x resident blocks per SM
  kExact,       // one block per kBlock * kPacks packs (one-shot kernels)
};

struct Variant {
  std::string name;
  Op op = Op::kCopy;
  Kernel kernel = nullptr;  // null: cudaMemcpyAsync
  int block = 0;
  GridKind grid_kind = GridKind::kWaves;
  int64_t per_block = 0;  // packs (or, for the pipeline, tiles) a block covers per pass
  int64_t count = 0;      // the kernel's count argument
  size_t shared_bytes = 0;
  bool needs_sm90 = false;
  // Filled in by Prepare.
  int64_t grid = 0;
  std::string skipped;
  std::string failed;
  std::vector<float> ms;
};

constexpr int kWaves = 4;

// A variant of 16-byte packs, packs_per_thread a thread per pass.
Variant Packs(const std::string& name, Op op, Kernel kernel, int block, int packs_per_thread,
              GridKind grid_kind, int64_t n) {
  return Variant{name, op, kernel, block, grid_kind, int64_t{block} * packs_per_thread, n / 4};
}

template <Op kOp, int kBlock, int kPacks, LoadHint kLoad = LoadHint::kPlain,
          StoreHint kStore = StoreHint::kPlain>
Variant GridStride(const std::string& name, GridKind grid_kind, int64_t n) {
  return Packs(name, kOp, GridStrideKernel<kOp, kBlock, kPacks, kLoad, kStore>, kBlock, kPacks,
               grid_kind, n);
}

template <Op kOp, int kBlock, int kPacks, LoadHint kLoad = LoadHint::kPlain,
          StoreHint kStore = StoreHint::kPlain>
Variant OneShot(const std::string& name, int64_t n) {
  return Packs(name, kOp, OneShotKernel<kOp, kBlock, kPacks, kLoad, kStore>, kBlock, kPacks,
               GridKind::kExact, n);
}

// One row for each block size in kBlocks.
template <Op kOp, int kPacks, int... kBlocks>
void GridStrideSweep(std::vector<Variant>& v, const std::string& name, GridKind grid_kind,
                     int64_t n) {
  (v.push_back(GridStride<kOp, kBlocks, kPacks>(name, grid_kind, n)), ...);
}

template <Op kOp, int kPacks, int... kBlocks>
void OneShotSweep(std::vector<Variant>& v, const std::string& name, int64_t n) {
  (v.push_back(OneShot<kOp, kBlocks, kPacks>(name, n)), ...);
}

template <Op kOp, int kStages, int kTileBytes>
Variant BulkPipeline(const std::string& name, int64_t n) {
  return Variant{name,
                 kOp,
                 BulkPipelineKernel<kOp, kStages, kTileBytes>,
                 kBulkBlock,
                 GridKind::kPersistent,
                 /*per_block=*/1,
                 /*count=*/n * int64_t{sizeof(float)} / kTileBytes,
                 /*shared_bytes=*/size_t{kStages} * kTileBytes,
                 /*needs_sm90=*/true};
}

std::vector<Variant> Variants(int64_t n) {
  using L = LoadHint;
  using S = StoreHint;
  constexpr Op kC = Op::kCopy;
  constexpr Op kS = Op::kSubtract;
  constexpr GridKind kW = GridKind::kWaves;
  constexpr GridKind kP = GridKind::kPersistent;
  const std::string ld = ", ld.nc.L1::no_allocate.L2::256B";
  const std::string na = ", st.L1::no_allocate";
  const std::string ef = ", st.L2::cache_hint evict_first";
  std::vector<Variant> v;
  v.push_back(Variant{"copy engine (cudaMemcpyAsync D2D)"});
  v.push_back(GridStride<kC, 256, 2>("copy, grid-stride 2 x 16 B", kW, n));
  v.push_back(GridStride<kC, 256, 2>("copy, grid-stride 2 x 16 B, persistent", kP, n));
  v.push_back(OneShot<kC, 256, 4>("copy, one-shot 4 x 16 B", n));
  GridStrideSweep<kS, 2, 128, 256, 512, 1024>(v, "x - c, grid-stride 2 x 16 B", kW, n);
  GridStrideSweep<kS, 2, 128, 256, 512, 1024>(v, "x - c, grid-stride 2 x 16 B, persistent", kP, n);
  OneShotSweep<kS, 4, 128, 256, 512, 1024>(v, "x - c, one-shot 4 x 16 B", n);
  OneShotSweep<kS, 8, 128, 256, 512, 1024>(v, "x - c, one-shot 8 x 16 B", n);
  v.push_back(GridStride<kC, 256, 2, L::kNoAllocate256B, S::kEvictFirst>(
      "copy, grid-stride 2 x 16 B" + ld + ef, kW, n));
  v.push_back(
      GridStride<kS, 256, 2, L::kNoAllocate256B>("x - c, grid-stride 2 x 16 B" + ld, kW, n));
  v.push_back(
      GridStride<kS, 256, 2, L::kPlain, S::kNoAllocate>("x - c, grid-stride 2 x 16 B" + na, kW, n));
  v.push_back(
      GridStride<kS, 256, 2, L::kPlain, S::kEvictFirst>("x - c, grid-stride 2 x 16 B" + ef, kW, n));
  v.push_back(GridStride<kS, 256, 2, L::kNoAllocate256B, S::kNoAllocate>(
      "x - c, grid-stride 2 x 16 B" + ld + na, kW, n));
  v.push_back(GridStride<kS, 256, 2, L::kNoAllocate256B, S::kEvictFirst>(
      "x - c, grid-stride 2 x 16 B" + ld + ef, kW, n));
  v.push_back(OneShot<kS, 256, 4, L::kNoAllocate256B, S::kNoAllocate>(
      "x - c, one-shot 4 x 16 B" + ld + na, n));
  v.push_back(OneShot<kS, 256, 4, L::kNoAllocate256B, S::kEvictFirst>(
      "x - c, one-shot 4 x 16 B" + ld + ef, n));
  v.push_back(BulkPipeline<kC, 4, 16384>("copy, bulk pipeline 4 x 16 KiB", n));
  v.push_back(BulkPipeline<kC, 4, 32768>("copy, bulk pipeline 4 x 32 KiB", n));
  v.push_back(BulkPipeline<kC, 8, 16384>("copy, bulk pipeline 8 x 16 KiB", n));
  v.push_back(BulkPipeline<kS, 4, 16384>("x - c, bulk pipeline 4 x 16 KiB", n));
  v.push_back(BulkPipeline<kS, 4, 32768>("x - c, bulk pipeline 4 x 32 KiB", n));
  v.push_back(BulkPipeline<kS, 8, 16384>("x - c, bulk pipeline 8 x 16 KiB", n));
  return v;
}

// The grid of a variant on this device, or why it cannot run here.
void Prepare(Variant& v, const cudaDeviceProp& device) {
  if (v.kernel == nullptr) return;
  if (v.needs_sm90 && device.major < 9) {
    v.skipped = "skipped: needs compute capability 9.0";
    return;
  }
  const void* kernel = reinterpret_cast<const void*>(v.kernel);
  if (v.shared_bytes > 48 * 1024) {
    COPY_SHAPES_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(v.shared_bytes)));
  }
  int resident = 0;
  COPY_SHAPES_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, v.block, v.shared_bytes));
  if (resident <= 0) {
    v.skipped = "skipped: no block fits an SM";
    return;
  }
  const int64_t full = int64_t{device.multiProcessorCount} * resident;
  const int64_t passes = (v.count + v.per_block - 1) / v.per_block;
  switch (v.grid_kind) {
    case GridKind::kWaves:
      v.grid = std::min(passes, full * kWaves);
      break;
    case GridKind::kPersistent:
      v.grid = std::min(passes, full);
      break;
    case GridKind::kExact:
      if (v.count % v.per_block != 0) {
        v.skipped = "skipped: n is not a whole number of blocks";
        return;
      }
      v.grid = passes;
      break;
  }
  if (v.grid > 0x7fffffff) v.skipped = "skipped: grid too large";
}

void Launch(const Variant& v, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (v.kernel == nullptr) {
    COPY_SHAPES_CHECK(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  v.kernel<<<static_cast<unsigned>(v.grid), v.block, v.shared_bytes, stream>>>(x, y, v.count,
                                                                               kSubtrahend);
  COPY_SHAPES_CHECK(cudaGetLastError());
}

// Runs the variant once over a poisoned y and its guard, and says what is wrong, if
// anything, in v.failed.
void Check(Variant& v, const float* x, float* y, int64_t n, unsigned long long* counters,
           cudaStream_t stream) {
  const int64_t total = n + kGuard;
  COPY_SHAPES_CHECK(cudaMemsetAsync(y, 0xFF, total * sizeof(float), stream));
  const unsigned long long init[2] = {0, ~0ull};
  COPY_SHAPES_CHECK(cudaMemcpyAsync(counters, init, sizeof(init), cudaMemcpyHostToDevice, stream));
  Launch(v, x, y, n, stream);
  CheckKernel<<<4096, 256, 0, stream>>>(y, n, total, v.op, kSubtrahend, counters, counters + 1);
  COPY_SHAPES_CHECK(cudaGetLastError());
  unsigned long long result[2] = {0, 0};
  COPY_SHAPES_CHECK(
      cudaMemcpyAsync(result, counters, sizeof(result), cudaMemcpyDeviceToHost, stream));
  COPY_SHAPES_CHECK(cudaStreamSynchronize(stream));
  if (result[0] != 0) {
    v.failed =
        "FAILED: " + std::to_string(result[0]) + " wrong, first at " + std::to_string(result[1]);
  }
}

bool ParseFlag(const char* arg, const char* name, int& value) {
  const size_t length = std::strlen(name);
  if (std::strncmp(arg, name, length) != 0 || arg[length] != '=') return false;
  char* end = nullptr;
  const long parsed = std::strtol(arg + length + 1, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1000000) {
    std::fprintf(stderr, "copy_shapes: %s wants a whole number\n", name);
    std::exit(2);
  }
  value = static_cast<int>(parsed);
  return true;
}

double Median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2.0;
}

}  // namespace

int main(int argc, char** argv) {
  int log2n = 28;
  int runs = 21;
  int warmups = 3;
  for (int i = 1; i < argc; ++i) {
    if (ParseFlag(argv[i], "--log2n", log2n) || ParseFlag(argv[i], "--runs", runs) ||
        ParseFlag(argv[i], "--warmups", warmups)) {
      continue;
    }
    std::fprintf(stderr, "usage: %s [--log2n=28] [--runs=21] [--warmups=3]\n", argv[0]);
    return 2;
  }
  // 2^20 elements make every block and tile shape here divide n; 2^30 is 8 GiB in all.
  if (log2n < 20 || log2n > 30 || runs < 1) {
    std::fprintf(stderr, "copy_shapes: --log2n must be 20 to 30 and --runs at least 1\n");
    return 2;
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp device{};
  COPY_SHAPES_CHECK(cudaGetDeviceProperties(&device, 0));
  const int64_t n = int64_t{1} << log2n;

  float* x = nullptr;
  float* y = nullptr;
  unsigned long long* counters = nullptr;
  COPY_SHAPES_CHECK(cudaMalloc(&x, n * sizeof(float)));
  COPY_SHAPES_CHECK(cudaMalloc(&y, (n + kGuard) * sizeof(float)));
  COPY_SHAPES_CHECK(cudaMalloc(&counters, 2 * sizeof(unsigned long long)));
  cudaStream_t stream = nullptr;
  COPY_SHAPES_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  FillKernel<<<4096, 256, 0, stream>>>(x, n);
  COPY_SHAPES_CHECK(cudaGetLastError());

  std::vector<Variant> variants = Variants(n);
  bool failed = false;
  for (Variant& v : variants) {
    Prepare(v, device);
    if (!v.skipped.empty()) continue;
    Check(v, x, y, n, counters, stream);
    failed = failed || !v.failed.empty();
  }

  // Round-robin: each round runs every variant once, so that clock and thermal drift
  // reach all of them alike. The first `warmups` rounds are not kept.
  std::vector<cudaEvent_t> events(2 * variants.size());
  for (cudaEvent_t& event : events) COPY_SHAPES_CHECK(cudaEventCreate(&event));
  constexpr int64_t kDelayNs = 2'000'000;  // far longer than queueing a round takes
  for (int round = 0; round < warmups + runs; ++round) {
    DelayKernel<<<1, 1, 0, stream>>>(kDelayNs);
    COPY_SHAPES_CHECK(cudaGetLastError());
    for (size_t i = 0; i < variants.size(); ++i) {
      if (!variants[i].skipped.empty()) continue;
      COPY_SHAPES_CHECK(cudaEventRecord(events[2 * i], stream));
      Launch(variants[i], x, y, n, stream);
      COPY_SHAPES_CHECK(cudaEventRecord(events[2 * i + 1], stream));
    }
    COPY_SHAPES_CHECK(cudaStreamSynchronize(stream));
    if (round < warmups) continue;
    for (size_t i = 0; i < variants.size(); ++i) {
      if (!variants[i].skipped.empty()) continue;
      float ms = 0;
      COPY_SHAPES_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
      variants[i].ms.push_back(ms);
    }
  }

  // Bytes read plus bytes written, as docs/performance.md counts the copy.
  const double bytes = 2.0 * static_cast<double>(n) * sizeof(float);
  const double copy_ms = Median(variants.front().ms);
  std::printf("%s, %d SMs, compute capability %d.%d\n", device.name, device.multiProcessorCount,
              device.major, device.minor);
  std::printf(
      "n = 2^%d float32 (%.2f GiB in, %.2f GiB out); median of %d runs after %d "
      "warm-ups, variants interleaved\n",
      log2n, n * 4.0 / (1 << 30), n * 4.0 / (1 << 30), runs, warmups);
  std::printf("copy engine: %.1f GB/s (bytes read + written)\n\n", bytes / copy_ms / 1e6);
  int width = 0;
  for (const Variant& v : variants) width = std::max(width, static_cast<int>(v.name.size()));
  std::printf("%-*s %5s %8s %8s %8s %6s\n", width, "variant", "block", "grid", "ms", "GB/s",
              "/copy");
  for (const Variant& v : variants) {
    const std::string block = v.kernel ? std::to_string(v.block) : "-";
    const std::string grid = v.kernel ? std::to_string(v.grid) : "-";
    if (!v.skipped.empty()) {
      std::printf("%-*s %5s %8s  %s\n", width, v.name.c_str(), block.c_str(), "-",
                  v.skipped.c_str());
      continue;
    }
    const double ms = Median(v.ms);
    std::printf("%-*s %5s %8s %8.4f %8.1f %6.3f%s%s\n", width, v.name.c_str(), block.c_str(),
                grid.c_str(), ms, bytes / ms / 1e6, copy_ms / ms, v.failed.empty() ? "" : "  ",
                v.failed.c_str());
  }

  for (cudaEvent_t event : events) COPY_SHAPES_CHECK(cudaEventDestroy(event));
  COPY_SHAPES_CHECK(cudaStreamDestroy(stream));
  COPY_SHAPES_CHECK(cudaFree(counters));
  COPY_SHAPES_CHECK(cudaFree(y));
  COPY_SHAPES_CHECK(cudaFree(x));
  return failed ? 1 : 0;
}
