// Tests of the CUDA kernels (kernels/cuda/kernels.h) against the CPU backend's kernels
// (server/cpu/kernels.h), the reference: bitwise where the contract says the backends
// agree bitwise (integer results, min/max/argmin/argmax, uniform, integer and normal v2
// random fills, fills), to tight tolerances where only the summation order or the math
// library differs (float sums, means, norms, products; normal v1 random fills).
//
// Every test skips where no CUDA device is present.
#include "kernels/cuda/kernels.h"

#include <gtest/gtest.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "server/cpu/kernels.h"
#include "server/cpu/thread_pool.h"
#include "tests/support/normal_v3_words.h"

namespace gpucompute::cuda {
namespace {

#define ASSERT_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorName(expr)

cpu::ThreadPool& Pool() {
  static cpu::ThreadPool* pool = new cpu::ThreadPool();
  return *pool;
}

constexpr DType kAllDTypes[] = {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32,
                                DType::kFloat64};

std::string ShapeName(const ReduceShape& s) {
  return "[" + std::to_string(s.outer) + ", " + std::to_string(s.extent) + ", " +
         std::to_string(s.inner) + "]";
}

// Device memory owned by the test; freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      cudaGetLastError();  // clear the non-sticky error of a machine without a driver
      GTEST_SKIP() << "no CUDA device";
    }
    ASSERT_CUDA_OK(cudaSetDevice(0));
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSERT_CUDA_OK(cudaDeviceGetDefaultMemPool(&pool_, 0));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Copies `bytes` from the device and waits for the stream first.
  std::vector<char> Download(const void* src, size_t bytes) {
    std::vector<char> host(bytes);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
};

// ---------------------------------------------------------------------------------
// Reduce
// ---------------------------------------------------------------------------------

double Unit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Random test data of `dtype` as raw bytes, never all zero. Bools use the bytes {0, 1, 2,
// 255} (nonzero reads as true); products use values near 1 (floats) or {-1, 1, 2, 3}
// (integers, which then wrap); otherwise floats in [-1, 1), int32 in [-1000, 1000] (many
// ties), int64 over the whole range (sums wrap).
std::vector<char> MakeData(DType dtype, int64_t n, bool for_prod, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> bytes(static_cast<size_t>(n) * DTypeSize(dtype));
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, uint8_t>) {
        constexpr uint8_t kBytes[] = {0, 1, 2, 255};
        p[i] = for_prod ? (Unit(rng) < 0.9999 ? 1 : 0) : kBytes[rng() % 4];
      } else if constexpr (std::is_floating_point_v<T>) {
        p[i] = static_cast<T>(for_prod ? 1.0 + (Unit(rng) - 0.5) * 0.002 : Unit(rng) * 2 - 1);
      } else if (for_prod) {
        constexpr T kFactors[] = {-1, 1, 1, 2, 3};
        p[i] = kFactors[rng() % 5];
      } else if constexpr (std::is_same_v<T, int32_t>) {
        p[i] = static_cast<int32_t>(static_cast<int64_t>(rng() % 2001) - 1000);
      } else {
        p[i] = static_cast<int64_t>(rng());
      }
    }
    if (n > 0 && p[0] == T{0}) p[0] = T{1};  // never all zero
  };
  switch (dtype) {
    case DType::kBool:
      fill(reinterpret_cast<uint8_t*>(bytes.data()));
      break;
    case DType::kInt32:
      fill(reinterpret_cast<int32_t*>(bytes.data()));
      break;
    case DType::kInt64:
      fill(reinterpret_cast<int64_t*>(bytes.data()));
      break;
    case DType::kFloat32:
      fill(reinterpret_cast<float*>(bytes.data()));
      break;
    case DType::kFloat64:
      fill(reinterpret_cast<double*>(bytes.data()));
      break;
  }
  return bytes;
}

template <typename T>
T Load(const std::vector<char>& bytes, int64_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

// For each output, sum |x| over its extent (the scale of a sum's rounding errors).
std::vector<double> AbsSums(DType dtype, const std::vector<char>& data, const ReduceShape& s) {
  std::vector<double> sums(static_cast<size_t>(s.outer * s.inner), 0.0);
  VisitDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t r = 0; r < s.extent; ++r) {
        for (int64_t i = 0; i < s.inner; ++i) {
          const Stored x = Load<Stored>(data, (o * s.extent + r) * s.inner + i);
          const double d = std::is_same_v<T, bool> ? (x != 0) : static_cast<double>(x);
          sums[o * s.inner + i] += std::fabs(d);
        }
      }
    }
  });
  return sums;
}

// Checks gpu against cpu (both raw outputs of ReduceResultDType(kind, dtype)).
void ExpectReduceMatches(ReduceKind kind, DType dtype, const ReduceShape& s,
                         const std::vector<char>& data, const std::vector<char>& cpu,
                         const std::vector<char>& gpu) {
  const DType out_dtype = ReduceResultDType(kind, dtype);
  const int64_t outputs = s.outer * s.inner;
  const std::string what =
      std::string(ReduceKindName(kind)) + " of " + DTypeName(dtype) + " " + ShapeName(s);
  const bool float_out = IsFloat(out_dtype);
  const bool approximate = float_out && (kind == ReduceKind::kSum || kind == ReduceKind::kProd ||
                                         kind == ReduceKind::kMean || kind == ReduceKind::kNorm2);
  if (!approximate) {
    // Integers, min, max, argmin, argmax: bitwise, except that any NaN equals any NaN.
    for (int64_t j = 0; j < outputs; ++j) {
      if (out_dtype == DType::kFloat32 && std::isnan(Load<float>(cpu, j))) {
        EXPECT_TRUE(std::isnan(Load<float>(gpu, j))) << what << " output " << j;
      } else if (out_dtype == DType::kFloat64 && std::isnan(Load<double>(cpu, j))) {
        EXPECT_TRUE(std::isnan(Load<double>(gpu, j))) << what << " output " << j;
      } else {
        const size_t size = DTypeSize(out_dtype);
        ASSERT_EQ(std::memcmp(cpu.data() + j * size, gpu.data() + j * size, size), 0)
            << what << " output " << j;
      }
    }
    return;
  }
  const double eps = out_dtype == DType::kFloat32 ? 0x1.0p-23 : 0x1.0p-52;
  std::vector<double> scale;
  if (kind == ReduceKind::kSum || kind == ReduceKind::kMean) scale = AbsSums(dtype, data, s);
  for (int64_t j = 0; j < outputs; ++j) {
    const double c = out_dtype == DType::kFloat32 ? Load<float>(cpu, j) : Load<double>(cpu, j);
    const double g = out_dtype == DType::kFloat32 ? Load<float>(gpu, j) : Load<double>(gpu, j);
    if (std::isnan(c)) {
      ASSERT_TRUE(std::isnan(g)) << what << " output " << j << ": gpu " << g;
      continue;
    }
    double tol;
    if (kind == ReduceKind::kProd && out_dtype == DType::kFloat32) {
      // Both multiply in float32 (kernels/reduce_ops.h), in different orders: each is
      // within gamma = k u / (1 - k u), k = extent - 1, u = 2^-24, of the exact product p,
      // so |g - c| <= 2 gamma |p| <= 2 gamma |c| / (1 - gamma). Only a bound: the GPU's
      // short partial products near 1 drift further than the CPU's long ones.
      // An empty extent's product is exactly 1 on both: k = 0, not negative.
      const double k = static_cast<double>(std::max<int64_t>(s.extent - 1, 0)) * 0x1.0p-24;
      const double gamma = k / (1 - k);
      tol = 2 * gamma / (1 - gamma) * std::fabs(c) + 1e-300;
    } else if (kind == ReduceKind::kProd) {
      // Float64 on both, in different orders: rounding errors that grow like sqrt(extent).
      tol = 16 * eps * std::sqrt(static_cast<double>(s.extent)) * std::fabs(c) + 1e-300;
    } else if (kind == ReduceKind::kNorm2) {
      tol = 2 * eps * std::fabs(c) + 1e-12 * std::fabs(c);
    } else {
      // Float64 accumulation, then one rounding to the output type; cancellation makes
      // the error relative to sum |x|, not to the sum.
      const double abs = kind == ReduceKind::kMean ? scale[j] / s.extent : scale[j];
      tol = 2 * eps * std::fabs(c) + 1e-12 * abs;
    }
    ASSERT_LE(std::fabs(g - c), tol) << what << " output " << j << ": gpu " << g << " cpu " << c;
  }
}

// Reduces `data` (of `dtype`, shape `s`) on both backends and compares. The device input
// starts `misalign` elements into its allocation, to exercise unaligned heads.
void CheckReduce(CudaKernelsTest* test, cudaStream_t stream, cudaMemPool_t pool, ReduceKind kind,
                 DType dtype, const ReduceShape& s, const std::vector<char>& data,
                 int64_t misalign = 0) {
  const DType out_dtype = ReduceResultDType(kind, dtype);
  const size_t out_bytes = static_cast<size_t>(s.outer * s.inner) * DTypeSize(out_dtype);
  std::vector<char> cpu(out_bytes);
  cpu::Reduce(kind, dtype, data.data(), s, cpu.data(), Pool());

  const size_t in_offset = static_cast<size_t>(misalign) * DTypeSize(dtype);
  DeviceBuffer in(data.size() + in_offset);
  DeviceBuffer out(out_bytes);
  ASSERT_NE(in.get(), nullptr);
  ASSERT_NE(out.get(), nullptr);
  // The upload and the 0xAB poison go on `stream`, the kernel's stream: plain cudaMemcpy
  // and cudaMemset run on the legacy default stream, which does not order with a
  // cudaStreamNonBlocking stream, so the poison could land after the kernel's stores
  // (seen on an H100 as outputs reading 0xABAB...).
  ASSERT_CUDA_OK(cudaMemcpyAsync(in.get() + in_offset, data.data(), data.size(),
                                 cudaMemcpyHostToDevice, stream));
  ASSERT_CUDA_OK(cudaMemsetAsync(out.get(), 0xAB, out_bytes, stream));
  ASSERT_CUDA_OK(ReduceAsync(kind, dtype, in.get() + in_offset, s, out.get(), pool, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<char> gpu(out_bytes);
  ASSERT_CUDA_OK(cudaMemcpy(gpu.data(), out.get(), out_bytes, cudaMemcpyDeviceToHost));
  ExpectReduceMatches(kind, dtype, s, data, cpu, gpu);
}

// Shapes covering every path of the dispatch: whole arrays, short and long contiguous
// segments (with and without chunk partials), strided with narrow, odd and wide inner,
// with and without extent chunks.
const ReduceShape kShapes[] = {
    {1, 1, 1},       {1, 7, 1},      {3, 1, 1},      {3, 1, 5},     {1, 1000003, 1},
    {1, 4097, 1},    {1, 70001, 1},  {1000, 3, 1},   {1000, 33, 1}, {77, 4096, 1},
    {7, 5000, 1},    {2, 100003, 1}, {1, 7, 3},      {4, 999, 300}, {1, 100001, 2},
    {3, 10007, 129}, {2, 513, 17},   {1, 65536, 64}, {5, 3, 1000},  {1, 40000, 7},
};

TEST_F(CudaKernelsTest, ReduceMatchesCpuForEveryKindDTypeAndShape) {
  uint64_t seed = 1;
  for (const ReduceShape& s : kShapes) {
    const int64_t n = s.outer * s.extent * s.inner;
    for (DType dtype : kAllDTypes) {
      const std::vector<char> data = MakeData(dtype, n, false, ++seed);
      const std::vector<char> prod_data = MakeData(dtype, n, true, ++seed);
      for (ReduceKind kind : kShapeReduceKinds) {
        CheckReduce(this, stream_, pool_, kind, dtype, s,
                    kind == ReduceKind::kProd ? prod_data : data);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaKernelsTest, ReduceMatchesCpuOnMisalignedInput) {
  const ReduceShape shapes[] = {{1, 100003, 1}, {3, 20001, 1}, {1, 9, 1}, {2, 1001, 3}};
  uint64_t seed = 100;
  for (const ReduceShape& s : shapes) {
    for (DType dtype : kAllDTypes) {
      const std::vector<char> data = MakeData(dtype, s.outer * s.extent * s.inner, false, ++seed);
      for (ReduceKind kind : kShapeReduceKinds) {
        if (kind == ReduceKind::kProd) continue;
        CheckReduce(this, stream_, pool_, kind, dtype, s, data, /*misalign=*/1);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaKernelsTest, ReduceMatchesCpuOnLargeArrays) {
  constexpr int64_t kN = (int64_t{1} << 24) + 3;
  const ReduceShape shapes[] = {{1, kN, 1}, {1, 4099, 4093}, {4093, 4099, 1}};
  uint64_t seed = 200;
  for (DType dtype : kAllDTypes) {
    const std::vector<char> data = MakeData(dtype, kN, false, ++seed);
    const std::vector<char> prod_data = MakeData(dtype, kN, true, ++seed);
    for (const ReduceShape& s : shapes) {
      if (s.outer * s.extent * s.inner > kN) continue;
      for (ReduceKind kind : kShapeReduceKinds) {
        // No bound on 2^24 float32 roundings says anything (float32 products are checked
        // on the other shapes, and in cuda_backend_test).
        if (kind == ReduceKind::kProd && dtype == DType::kFloat32 && s.extent == kN) continue;
        CheckReduce(this, stream_, pool_, kind, dtype, s,
                    kind == ReduceKind::kProd ? prod_data : data);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// NaNs at chosen positions: min and max give NaN, argmin and argmax the first NaN.
TEST_F(CudaKernelsTest, ReducePropagatesNan) {
  const ReduceShape shapes[] = {{1, 1000003, 1}, {1, 17, 1},  {50, 301, 1},
                                {3, 9001, 1},    {4, 777, 5}, {1, 3000, 300}};
  const ReduceKind kinds[] = {ReduceKind::kMin, ReduceKind::kMax, ReduceKind::kArgmin,
                              ReduceKind::kArgmax, ReduceKind::kSum};
  uint64_t seed = 300;
  for (const ReduceShape& s : shapes) {
    const int64_t n = s.outer * s.extent * s.inner;
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      std::vector<char> data = MakeData(dtype, n, false, ++seed);
      std::mt19937_64 rng(seed);
      // About one output in three gets NaNs, one or two, anywhere along its extent.
      for (int64_t j = 0; j < s.outer * s.inner; j += 3) {
        const int64_t o = j / s.inner, i = j % s.inner;
        for (int k = 0; k < 1 + static_cast<int>(j % 2); ++k) {
          const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(s.extent));
          const int64_t at = (o * s.extent + r) * s.inner + i;
          if (dtype == DType::kFloat32) {
            const float nan = std::numeric_limits<float>::quiet_NaN();
            std::memcpy(data.data() + at * 4, &nan, 4);
          } else {
            const double nan = std::numeric_limits<double>::quiet_NaN();
            std::memcpy(data.data() + at * 8, &nan, 8);
          }
        }
      }
      for (ReduceKind kind : kinds) {
        CheckReduce(this, stream_, pool_, kind, dtype, s, data);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Ties: the first extreme wins, whichever thread or chunk saw it.
TEST_F(CudaKernelsTest, ArgReductionsPickTheFirstOfTies) {
  const ReduceShape shapes[] = {{1, 1000003, 1}, {1, 33, 1}, {6, 20000, 1}, {2, 5000, 40}};
  for (const ReduceShape& s : shapes) {
    const int64_t n = s.outer * s.extent * s.inner;
    for (DType dtype : kAllDTypes) {
      // Only two distinct values: 1 and 2 (bool: 0 and 1), extremes at many places.
      std::vector<char> data = MakeData(dtype, n, false, 7);
      std::mt19937_64 rng(11);
      VisitDType(dtype, [&](auto zero) {
        using T = decltype(zero);
        using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
        for (int64_t k = 0; k < n; ++k) {
          const Stored v = std::is_same_v<T, bool> ? static_cast<Stored>(rng() % 2)
                                                   : static_cast<Stored>(1 + rng() % 2);
          std::memcpy(data.data() + k * sizeof(Stored), &v, sizeof(Stored));
        }
      });
      for (ReduceKind kind :
           {ReduceKind::kArgmin, ReduceKind::kArgmax, ReduceKind::kMin, ReduceKind::kMax}) {
        CheckReduce(this, stream_, pool_, kind, dtype, s, data);
        if (HasFatalFailure()) return;
      }
      // All equal: position 0 everywhere.
      std::vector<char> equal(data.size(), 0);
      for (ReduceKind kind : {ReduceKind::kArgmin, ReduceKind::kArgmax}) {
        CheckReduce(this, stream_, pool_, kind, dtype, s, equal);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaKernelsTest, ReduceIsDeterministic) {
  const ReduceShape shapes[] = {{1, 1000003, 1}, {1, 100001, 300}, {1000, 999, 1}};
  for (const ReduceShape& s : shapes) {
    const int64_t n = s.outer * s.extent * s.inner;
    const std::vector<char> data = MakeData(DType::kFloat64, n, false, 5);
    DeviceBuffer in(data.size());
    DeviceBuffer out(static_cast<size_t>(s.outer * s.inner) * 8);
    ASSERT_CUDA_OK(
        cudaMemcpyAsync(in.get(), data.data(), data.size(), cudaMemcpyHostToDevice, stream_));
    std::vector<char> first;
    for (int run = 0; run < 3; ++run) {
      ASSERT_CUDA_OK(
          ReduceAsync(ReduceKind::kSum, DType::kFloat64, in.get(), s, out.get(), pool_, stream_));
      std::vector<char> result = Download(out.get(), static_cast<size_t>(s.outer * s.inner) * 8);
      if (run == 0) {
        first = result;
      } else {
        ASSERT_EQ(first, result) << ShapeName(s) << " run " << run;
      }
    }
  }
}

TEST_F(CudaKernelsTest, ReduceOfEmptyExtent) {
  const ReduceShape s = {2, 0, 3};
  for (DType dtype : kAllDTypes) {
    for (ReduceKind kind :
         {ReduceKind::kSum, ReduceKind::kProd, ReduceKind::kMean, ReduceKind::kNorm2}) {
      CheckReduce(this, stream_, pool_, kind, dtype, s, {});
      if (HasFatalFailure()) return;
    }
    DeviceBuffer out(64);
    for (ReduceKind kind :
         {ReduceKind::kMin, ReduceKind::kMax, ReduceKind::kArgmin, ReduceKind::kArgmax}) {
      EXPECT_EQ(ReduceAsync(kind, dtype, out.get(), s, out.get(), pool_, stream_),
                cudaErrorInvalidValue);
    }
  }
}

// ---------------------------------------------------------------------------------
// Fill
// ---------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, FillWritesExactlyTheRange) {
  constexpr uint64_t kBits = 0xDEADBEEFCAFEF00Dull;  // only the low bytes are the value
  const int64_t counts[] = {1, 3, 17, 1000003};
  for (DType dtype : kAllDTypes) {
    const size_t size = DTypeSize(dtype);
    for (int64_t count : counts) {
      for (int64_t misalign : {0, 1, 3}) {
        // Guard elements around the range must stay as they were.
        const int64_t total = count + misalign + 5;
        DeviceBuffer buf(static_cast<size_t>(total) * size);
        ASSERT_CUDA_OK(
            cudaMemsetAsync(buf.get(), 0x5A, static_cast<size_t>(total) * size, stream_));
        ASSERT_CUDA_OK(FillAsync(buf.get() + misalign * size, dtype, kBits, count, stream_));
        const std::vector<char> host = Download(buf.get(), static_cast<size_t>(total) * size);
        for (int64_t k = 0; k < total; ++k) {
          const bool inside = k >= misalign && k < misalign + count;
          for (size_t b = 0; b < size; ++b) {
            const auto expected =
                static_cast<unsigned char>(inside ? (kBits >> (8 * b)) & 0xFF : 0x5A);
            ASSERT_EQ(static_cast<unsigned char>(host[k * size + b]), expected)
                << DTypeName(dtype) << " count " << count << " misalign " << misalign << " element "
                << k << " byte " << b;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// Random
// ---------------------------------------------------------------------------------

struct RandomCase {
  Distribution dist;
  DType dtype;
  int64_t low = 0, high = 0;
  NormalTransform transform = NormalTransform::kBoxMullerV1;
};

TEST_F(CudaKernelsTest, RandomMatchesCpu) {
  const RandomCase cases[] = {
      {Distribution::kUniform, DType::kFloat32},
      {Distribution::kUniform, DType::kFloat64},
      {Distribution::kNormal, DType::kFloat32},
      {Distribution::kNormal, DType::kFloat64},
      {Distribution::kNormal, DType::kFloat32, 0, 0, NormalTransform::kBoxMullerV2},
      {Distribution::kNormal, DType::kFloat64, 0, 0, NormalTransform::kBoxMullerV2},
      {Distribution::kNormal, DType::kFloat32, 0, 0, NormalTransform::kInverseCdfV3},
      {Distribution::kNormal, DType::kFloat64, 0, 0, NormalTransform::kInverseCdfV3},
      {Distribution::kIntegers, DType::kInt32, -1000, 1001},
      {Distribution::kIntegers, DType::kInt32, std::numeric_limits<int32_t>::min(),
       std::numeric_limits<int32_t>::max()},
      {Distribution::kIntegers, DType::kInt64, -5, 17},
      {Distribution::kIntegers, DType::kInt64, std::numeric_limits<int64_t>::min(),
       std::numeric_limits<int64_t>::max()},
  };
  const int64_t sizes[] = {1, 3, 7, 1000003};
  // The second offset carries into the counter's high word within the fill.
  const uint64_t offsets[] = {12345, 0xFFFFFFFFull - 100};
  for (const RandomCase& c : cases) {
    for (int64_t n : sizes) {
      for (uint64_t offset : offsets) {
        for (int64_t misalign : {0, 1}) {
          RandomParams p;
          p.distribution = c.dist;
          p.seed = 0x0123456789ABCDEFull;
          p.offset = offset;
          p.mean = 0.5;
          p.stddev = 2.0;
          p.low = c.low;
          p.high = c.high;
          p.normal_transform = c.transform;
          const size_t size = DTypeSize(c.dtype);
          std::vector<char> cpu(static_cast<size_t>(n) * size);
          cpu::Random(p, c.dtype, cpu.data(), n, Pool());
          DeviceBuffer buf(static_cast<size_t>(n + misalign) * size);
          char* out = buf.get() + misalign * size;
          ASSERT_CUDA_OK(RandomAsync(p, c.dtype, out, n, stream_));
          const std::vector<char> gpu = Download(out, static_cast<size_t>(n) * size);
          const std::string what = std::string(DTypeName(c.dtype)) + " dist " +
                                   std::to_string(static_cast<int>(c.dist)) + " n " +
                                   std::to_string(n) + " misalign " + std::to_string(misalign) +
                                   " transform v" + std::to_string(static_cast<int>(c.transform));
          if (c.dist != Distribution::kNormal || c.transform != NormalTransform::kBoxMullerV1) {
            ASSERT_EQ(cpu, gpu) << what;  // bitwise
            continue;
          }
          // Normals v1: CUDA's and glibc's log/sin/cos differ in the last bits.
          for (int64_t i = 0; i < n; ++i) {
            const double a =
                c.dtype == DType::kFloat32 ? Load<float>(cpu, i) : Load<double>(cpu, i);
            const double b =
                c.dtype == DType::kFloat32 ? Load<float>(gpu, i) : Load<double>(gpu, i);
            const double tol =
                (c.dtype == DType::kFloat32 ? 2e-6 : 1e-14) * (std::fabs(a) + p.stddev);
            ASSERT_LE(std::fabs(a - b), tol) << what << " element " << i;
          }
        }
      }
    }
  }
}

// The device's normal v2 transform against the CPU's, bit for bit, on inputs a fill's
// counters cannot choose. Float32: all 2^24 values of u1 and of u2 (the top 24 bits of
// the words), each pair (w0, w1) taking u1 = i and u2 = i, and (w2, w3) u1 = i and
// u2 = 2^24 - 1 - i with the low 8 bits set (which the transform ignores). Float64: the
// ends of both ranges and 2^22 words from a fixed generator. A mean and stddev other
// than 0 and 1 keep the final fma in the comparison.
TEST_F(CudaKernelsTest, RandomNormalV2MatchesCpuOnEveryFloat32InputAndFloat64Sample) {
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.normal_transform = NormalTransform::kBoxMullerV2;
  p.mean = 0.25;
  p.stddev = 3.0;
  struct Case {
    DType dtype;
    std::vector<uint32_t> words;
  };
  std::vector<Case> cases(2);
  cases[0].dtype = DType::kFloat32;
  for (uint32_t i = 0; i < (1u << 24); ++i) {
    const uint32_t mirrored = (1u << 24) - 1 - i;
    cases[0].words.insert(cases[0].words.end(),
                          {i << 8, i << 8, (i << 8) | 0xffu, (mirrored << 8) | 0xffu});
  }
  cases[1].dtype = DType::kFloat64;
  for (uint32_t lo : {0u, 1u, 0x7ffu, 0x800u, 0xffffffffu}) {
    for (uint32_t hi : {0u, 1u, 0x80000000u, 0xfffffffeu, 0xffffffffu}) {
      cases[1].words.insert(cases[1].words.end(), {lo, hi, lo, hi});
      cases[1].words.insert(cases[1].words.end(), {lo, hi, ~lo, ~hi});
    }
  }
  std::mt19937_64 rng(20261127);
  for (int i = 0; i < (1 << 22); ++i) {
    const uint64_t a = rng(), b = rng();
    cases[1].words.insert(cases[1].words.end(),
                          {static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                           static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32)});
  }
  for (const Case& c : cases) {
    const int64_t blocks = static_cast<int64_t>(c.words.size() / 4);
    const int k = ElementsPerCounter(Distribution::kNormal, c.dtype);
    const size_t out_bytes = static_cast<size_t>(blocks) * k * DTypeSize(c.dtype);
    std::vector<char> cpu(out_bytes);
    for (int64_t b = 0; b < blocks; ++b) {
      const PhiloxWords w = {
          {c.words[4 * b], c.words[4 * b + 1], c.words[4 * b + 2], c.words[4 * b + 3]}};
      if (c.dtype == DType::kFloat32) {
        Float32Lanes(w, p, reinterpret_cast<float*>(cpu.data()) + 4 * b);
      } else {
        Float64Lanes(w, p, reinterpret_cast<double*>(cpu.data()) + 2 * b);
      }
    }
    DeviceBuffer words(c.words.size() * sizeof(uint32_t));
    ASSERT_CUDA_OK(cudaMemcpy(words.get(), c.words.data(), c.words.size() * sizeof(uint32_t),
                              cudaMemcpyHostToDevice));
    DeviceBuffer out(out_bytes);
    ASSERT_CUDA_OK(RandomLanesForTestingAsync(
        p, c.dtype, reinterpret_cast<const uint32_t*>(words.get()), blocks, out.get(), stream_));
    const std::vector<char> gpu = Download(out.get(), out_bytes);
    for (int64_t b = 0; b < blocks; ++b) {
      const size_t at = static_cast<size_t>(b) * k * DTypeSize(c.dtype);
      const size_t size = static_cast<size_t>(k) * DTypeSize(c.dtype);
      ASSERT_EQ(memcmp(cpu.data() + at, gpu.data() + at, size), 0)
          << DTypeName(c.dtype) << " block " << b << " words " << std::hex << c.words[4 * b] << " "
          << c.words[4 * b + 1] << " " << c.words[4 * b + 2] << " " << c.words[4 * b + 3];
    }
  }
}

// Normal v3's fill kernel (its table staged in shared memory, eight copies) against the
// CPU, bit for bit: a standard fill (the kernel that leaves out the final fma) and a
// scaled one, 2^26 values each, at an offset whose counters carry into the high word.
TEST_F(CudaKernelsTest, RandomNormalV3FillMatchesCpuStandardAndScaled) {
  const int64_t n = int64_t{1} << 26;
  for (const auto& [mean, stddev] : {std::pair{0.0, 1.0}, std::pair{-1.5, 0.25}}) {
    RandomParams p;
    p.distribution = Distribution::kNormal;
    p.normal_transform = NormalTransform::kInverseCdfV3;
    p.seed = 20261128;
    p.offset = 0xFFFFFFFFull - 1000;
    p.mean = mean;
    p.stddev = stddev;
    std::vector<char> cpu(static_cast<size_t>(n) * sizeof(float));
    cpu::Random(p, DType::kFloat32, cpu.data(), n, Pool());
    DeviceBuffer buf(static_cast<size_t>(n) * sizeof(float));
    ASSERT_CUDA_OK(RandomAsync(p, DType::kFloat32, buf.get(), n, stream_));
    const std::vector<char> gpu = Download(buf.get(), static_cast<size_t>(n) * sizeof(float));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(memcmp(cpu.data() + 4 * i, gpu.data() + 4 * i, 4), 0)
          << "mean " << mean << " stddev " << stddev << " element " << i << ": cpu "
          << Load<float>(cpu, i) << " gpu " << Load<float>(gpu, i);
    }
  }
}

// Normal v3's float32 transform on the device against the CPU's, bit for bit, on words a
// fill's counters cannot choose: every 64th word of all 2^32, and the words of the first
// and last 64 b's of every segment (both signs).
TEST_F(CudaKernelsTest, RandomNormalV3MatchesCpuOnEverySegmentsEdgesAndAStrideOfWords) {
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.normal_transform = NormalTransform::kInverseCdfV3;
  p.mean = 0.25;
  p.stddev = 3.0;
  std::vector<uint32_t> words;
  for (uint64_t w = 0; w < (uint64_t{1} << 32); w += 64) words.push_back(static_cast<uint32_t>(w));
  for (uint32_t w : testing::NormalV3SegmentEdgeWords(64)) words.push_back(w);
  while (words.size() % 4 != 0) words.push_back(0);
  const int64_t blocks = static_cast<int64_t>(words.size() / 4);
  std::vector<float> cpu(words.size());
  for (int64_t b = 0; b < blocks; ++b) {
    const PhiloxWords w = {{words[4 * b], words[4 * b + 1], words[4 * b + 2], words[4 * b + 3]}};
    Float32Lanes(w, p, cpu.data() + 4 * b);
  }
  DeviceBuffer dwords(words.size() * sizeof(uint32_t));
  ASSERT_CUDA_OK(cudaMemcpy(dwords.get(), words.data(), words.size() * sizeof(uint32_t),
                            cudaMemcpyHostToDevice));
  DeviceBuffer out(words.size() * sizeof(float));
  ASSERT_CUDA_OK(RandomLanesForTestingAsync(p, DType::kFloat32,
                                            reinterpret_cast<const uint32_t*>(dwords.get()),
                                            blocks, out.get(), stream_));
  const std::vector<char> gpu = Download(out.get(), words.size() * sizeof(float));
  for (size_t i = 0; i < words.size(); ++i) {
    ASSERT_EQ(memcmp(&cpu[i], gpu.data() + 4 * i, 4), 0)
        << "word " << std::hex << words[i] << ": cpu " << cpu[i] << " gpu "
        << Load<float>(gpu, static_cast<int64_t>(i));
  }
}

TEST_F(CudaKernelsTest, RandomRejectsUndefinedCombinations) {
  DeviceBuffer buf(64);
  RandomParams p;
  p.distribution = Distribution::kUniform;
  EXPECT_EQ(RandomAsync(p, DType::kInt32, buf.get(), 4, stream_), cudaErrorInvalidValue);
  p.distribution = Distribution::kIntegers;
  p.low = 3;
  p.high = 3;
  EXPECT_EQ(RandomAsync(p, DType::kInt64, buf.get(), 4, stream_), cudaErrorInvalidValue);
  p.high = 9;
  EXPECT_EQ(RandomAsync(p, DType::kFloat32, buf.get(), 4, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(RandomAsync(p, DType::kBool, buf.get(), 4, stream_), cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------------
// Gemv
// ---------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, GemvMatchesCpu) {
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetPointerMode(cublas, CUBLAS_POINTER_MODE_HOST), CUBLAS_STATUS_SUCCESS);
  const std::pair<int64_t, int64_t> sizes[] = {{3, 5}, {64, 33}, {257, 1}, {0, 4}, {4, 0}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const auto& [rows, cols] : sizes) {
      for (bool col_major : {false, true}) {
        for (bool transpose : {false, true}) {
          for (double beta : {0.0, 0.5}) {
            const GemvShape shape{rows, cols, col_major, transpose};
            const int64_t x_len = transpose ? rows : cols;
            const int64_t y_len = transpose ? cols : rows;
            const std::vector<char> a = MakeData(dtype, rows * cols, false, 1);
            const std::vector<char> x = MakeData(dtype, x_len, false, 2);
            std::vector<char> expected = MakeData(dtype, y_len, false, 3);
            DeviceBuffer a_dev(a.size()), x_dev(x.size()), y_dev(expected.size());
            ASSERT_CUDA_OK(cudaMemcpy(a_dev.get(), a.data(), a.size(), cudaMemcpyHostToDevice));
            ASSERT_CUDA_OK(cudaMemcpy(x_dev.get(), x.data(), x.size(), cudaMemcpyHostToDevice));
            ASSERT_CUDA_OK(cudaMemcpy(y_dev.get(), expected.data(), expected.size(),
                                      cudaMemcpyHostToDevice));
            const GemvStatus status = GemvAsync(cublas, dtype, shape, 1.5, a_dev.get(),
                                                x_dev.get(), beta, y_dev.get(), stream_);
            ASSERT_TRUE(status.ok()) << status.call << " " << cudaGetErrorName(status.cuda)
                                     << " " << cublasGetStatusName(status.cublas);
            const std::vector<char> y = Download(y_dev.get(), expected.size());
            cpu::Gemv(dtype, shape, 1.5, a.data(), x.data(), beta, expected.data(), Pool());
            const int64_t inner = transpose ? rows : cols;
            // Only the summation order differs: inner terms of magnitude below 1.5 each.
            const double tolerance =
                (dtype == DType::kFloat32 ? 1e-6 : 1e-14) * 4 * (static_cast<double>(inner) + 1);
            for (int64_t i = 0; i < y_len; ++i) {
              double got = 0, want = 0;
              if (dtype == DType::kFloat32) {
                got = reinterpret_cast<const float*>(y.data())[i];
                want = reinterpret_cast<const float*>(expected.data())[i];
              } else {
                got = reinterpret_cast<const double*>(y.data())[i];
                want = reinterpret_cast<const double*>(expected.data())[i];
              }
              ASSERT_NEAR(got, want, tolerance)
                  << DTypeName(dtype) << " " << rows << "x" << cols << " col_major " << col_major
                  << " transpose " << transpose << " beta " << beta << " element " << i;
            }
          }
        }
      }
    }
  }
  cublasDestroy(cublas);
}

TEST_F(CudaKernelsTest, GemvRejectsOtherDTypes) {
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  DeviceBuffer buf(64);
  const GemvStatus status = GemvAsync(cublas, DType::kInt32, GemvShape{2, 2, false, false}, 1.0,
                                      buf.get(), buf.get(), 0.0, buf.get(), stream_);
  EXPECT_EQ(status.cuda, cudaErrorInvalidValue);
  EXPECT_FALSE(status.ok());
  cublasDestroy(cublas);
}

}  // namespace
}  // namespace gpucompute::cuda
