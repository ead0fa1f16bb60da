// Counter-based random fills on the CPU, as kernels/philox.h defines them.
//
// Element i depends only on (params, dtype, i): each task computes the Philox blocks
// of its own elements from their counters, with no generator state shared between
// tasks, so the output is bit-identical across runs and thread counts. The per-block
// functions are the ones a CUDA kernel calls, so uniforms, integers and normal v2 also
// match other backends bit for bit (normal v1 to a few ulp; see philox.h).
#include <algorithm>
#include <cassert>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "server/cpu/kernels.h"
#include "server/cpu/thread_pool.h"

namespace gpucompute::cpu {
namespace {

// Philox blocks per ParallelFor chunk: 16K blocks are 32K-64K elements, several hundred
// microseconds of work, so scheduling costs are negligible.
constexpr int64_t kBlocksPerChunk = int64_t{1} << 14;

// Fills out[0, n) from blocks params.offset + b; `lanes(block, params, values)` writes
// the kLanes values of one block, which are converted to T.
template <typename T, typename V, int kLanes, typename Lanes>
void Fill(const RandomParams& params, T* out, int64_t n, ThreadPool& pool, Lanes lanes) {
  const int64_t blocks = n / kLanes + (n % kLanes != 0 ? 1 : 0);
  const PhiloxRoundKeys keys = PhiloxRoundKeysFor(PhiloxKeyFromSeed(params.seed));
  pool.ParallelFor(blocks, kBlocksPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const PhiloxWords words = PhiloxBlock(keys, params.offset + static_cast<uint64_t>(b));
      V values[kLanes];
      lanes(words, params, values);
      T* dst = out + b * kLanes;
      const int count = static_cast<int>(std::min<int64_t>(kLanes, n - b * kLanes));
      for (int j = 0; j < count; ++j) dst[j] = static_cast<T>(values[j]);
    }
  });
}

}  // namespace

void Random(const RandomParams& params, DType dtype, void* out, int64_t n, ThreadPool& pool) {
  if (n <= 0) return;
  // The caller rejects unsupported combinations (ElementsPerCounter == 0).
  assert(ElementsPerCounter(params.distribution, dtype) != 0);
  if (params.distribution == Distribution::kIntegers) {
    assert(params.low < params.high);
    if (dtype == DType::kInt32) {
      Fill<int32_t, int64_t, 2>(
          params, static_cast<int32_t*>(out), n, pool,
          [](const PhiloxWords& w, const RandomParams& p, int64_t* v) { IntegerLanes(w, p, v); });
    } else if (dtype == DType::kInt64) {
      Fill<int64_t, int64_t, 2>(
          params, static_cast<int64_t*>(out), n, pool,
          [](const PhiloxWords& w, const RandomParams& p, int64_t* v) { IntegerLanes(w, p, v); });
    }
    return;
  }
  if (dtype == DType::kFloat32) {
    Fill<float, float, 4>(
        params, static_cast<float*>(out), n, pool,
        [](const PhiloxWords& w, const RandomParams& p, float* v) { Float32Lanes(w, p, v); });
  } else if (dtype == DType::kFloat64) {
    Fill<double, double, 2>(
        params, static_cast<double*>(out), n, pool,
        [](const PhiloxWords& w, const RandomParams& p, double* v) { Float64Lanes(w, p, v); });
  }
}

}  // namespace gpucompute::cpu
