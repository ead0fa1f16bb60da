// The CUDA backend against the CPU backend, element by element: every operation runs on
// both with the same random inputs, and the results must agree exactly where the
// contract says so (integers, bools, comparisons, min/max/arg reductions, random integers
// and uniforms) and within rounding elsewhere. Also the CUDA-only parts of the contract:
// the memory pool, out-of-memory, staged transfers, the kernel cache and several GPUs.
// Every test that needs a GPU skips where none is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "server/core/buffer_registry.h"
#include "server/cpu/cpu_backend.h"
#include "server/cuda/cuda_backend.h"
#include "server/cuda/cuda_check.h"
#include "server/core/executor.h"
#include "server/expression/expression.h"
#include "server/util/status_macros.h"
#include "tests/backend/backend_conformance.h"

namespace gpucompute {
namespace {

using conformance::Download;
using conformance::Synchronize;
using conformance::Upload;

template <typename T>
using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

// Whether two floats agree within `ulps` units in the last place of the larger, NaN
// matching NaN and infinities matching exactly.
template <typename T>
bool WithinUlps(T a, T b, int ulps) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  const T scale = std::max(std::fabs(a), std::fabs(b));
  const T ulp = scale > std::numeric_limits<T>::min()
                    ? std::nextafter(scale, std::numeric_limits<T>::infinity()) - scale
                    : std::numeric_limits<T>::denorm_min();
  return std::fabs(a - b) <= ulps * ulp;
}

template <typename T>
std::vector<Stored<T>> RandomValues(size_t n, uint64_t seed, double low = -4, double high = 4) {
  std::mt19937_64 rng(seed);
  std::vector<Stored<T>> v(n);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, bool>) {
      x = rng() & 1;
    } else if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(std::uniform_real_distribution<double>(low, high)(rng));
    } else {
      x = static_cast<T>(std::uniform_int_distribution<int64_t>(
          static_cast<int64_t>(low * 1000), static_cast<int64_t>(high * 1000))(rng));
    }
  }
  return v;
}

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device here";
    cuda::CudaBackendOptions options;
    ASSIGN_OR_FAIL(gpu_, cuda::CreateCudaBackend(options));
    cpu_ = std::make_unique<cpu::CpuBackend>(2);
    ASSIGN_OR_FAIL(gpu_stream_, gpu_->CreateStream(0));
    ASSIGN_OR_FAIL(cpu_stream_, cpu_->CreateStream(0));
  }

  // Runs `op` on both backends with the same inputs and returns both outputs' bytes.
  // `op(backend, stream, inputs, out)` enqueues the operation.
  template <typename Op>
  void RunBoth(const std::vector<std::vector<uint8_t>>& inputs, uint64_t out_bytes, Op op,
               std::vector<uint8_t>* cpu_out, std::vector<uint8_t>* gpu_out) {
    for (int side = 0; side < 2; ++side) {
      Backend& backend = side == 0 ? *cpu_ : *gpu_;
      Stream& stream = side == 0 ? *cpu_stream_ : *gpu_stream_;
      std::vector<DeviceMemory> memories;
      for (const auto& in : inputs) {
        ASSIGN_OR_FAIL(DeviceMemory m, Upload<uint8_t>(backend, stream, in));
        memories.push_back(std::move(m));
      }
      // Poisoned, so that an element the operation does not write shows.
      const std::vector<uint8_t> poison(out_bytes, 0xA5);
      ASSIGN_OR_FAIL(DeviceMemory out, Upload<uint8_t>(backend, stream, poison));
      ASSERT_OK(op(backend, stream, memories, out));
      ASSIGN_OR_FAIL(*(side == 0 ? cpu_out : gpu_out),
                     Download<uint8_t>(backend, stream, out, out_bytes));
    }
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Stream> gpu_stream_;
  std::unique_ptr<Stream> cpu_stream_;
};

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(T));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> FromBytes(const std::vector<uint8_t>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// Compares outputs of dtype `dtype`: exactly, or within `ulps` for floats.
void ExpectAgree(DType dtype, const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu,
                 int ulps, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  int64_t bad = 0;
  VisitDType(dtype, [&](auto zero) {
    using T = Stored<decltype(zero)>;
    const std::vector<T> c = FromBytes<T>(cpu);
    const std::vector<T> g = FromBytes<T>(gpu);
    for (size_t i = 0; i < c.size(); ++i) {
      bool ok;
      if constexpr (std::is_floating_point_v<T>) {
        ok = ulps == 0 ? (std::memcmp(&c[i], &g[i], sizeof(T)) == 0 ||
                          (std::isnan(c[i]) && std::isnan(g[i])))
                       : WithinUlps(c[i], g[i], ulps);
      } else {
        ok = c[i] == g[i];
      }
      if (!ok && ++bad <= 5) {
        ADD_FAILURE() << what << ": element " << i << " cpu " << +c[i] << " gpu " << +g[i];
      }
    }
  });
  EXPECT_EQ(bad, 0) << what;
}

TEST_F(CudaVsCpu, ElementwiseAgrees) {
  struct Case {
    const char* text;
    DType x;
    DType y;
    int ulps;  // 0: exact
  };
  const Case cases[] = {
      {"x + y", DType::kFloat32, DType::kFloat32, 0},
      {"x * y - x / y", DType::kFloat64, DType::kFloat64, 0},
      {"x + y", DType::kInt32, DType::kInt64, 0},
      {"x * y - 3", DType::kInt64, DType::kInt64, 0},
      {"where(x > y, x, -y)", DType::kFloat32, DType::kFloat64, 0},
      {"min(x, y) + max(x, y)", DType::kInt32, DType::kInt32, 0},
      {"x <= y", DType::kFloat64, DType::kInt32, 0},
      {"abs(x) ** 2 + floor(y) - ceil(x)", DType::kFloat64, DType::kFloat64, 0},
      {"x ** 3 + y", DType::kInt32, DType::kInt32, 0},
      // Math functions differ between glibc and CUDA in the last bits. Products (never
      // sums, whose cancellation would turn a last-bit difference into a large relative
      // one) keep each result within a few ulps of the other backend's.
      {"sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x)))) * y", DType::kFloat64, DType::kFloat64,
       8},
      {"sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x)))) * y", DType::kFloat32, DType::kFloat32,
       8},
      {"log1p(abs(x)) * expm1(y / 8) * atan2(y, x)", DType::kFloat64, DType::kFloat64, 8},
      {"log1p(abs(x)) * expm1(y / 8) * atan2(y, x)", DType::kFloat32, DType::kFloat32, 8},
      {"cos(x) * tan(y / 4) * exp(x)", DType::kFloat64, DType::kFloat64, 8},
      {"asin(x / 5) * acos(y / 5) * atan(x)", DType::kFloat32, DType::kFloat32, 8},
      {"sinh(y / 2) * cosh(x / 2) * log(abs(y) + 1)", DType::kFloat32, DType::kFloat32, 8},
  };
  constexpr size_t n = 100003;  // not a multiple of any vector width
  for (const Case& c : cases) {
    expr::InputMap types{{"x", expr::ArrayInput{c.x}}, {"y", expr::ArrayInput{c.y}}};
    absl::StatusOr<expr::Program> program = expr::Compile(c.text, types);
    ASSERT_OK(program) << c.text;
    std::vector<std::vector<uint8_t>> inputs;
    for (DType t : {c.x, c.y}) {
      inputs.push_back(VisitDType(t, [&](auto zero) {
        return AsBytes(RandomValues<decltype(zero)>(n, inputs.size() + 7));
      }));
    }
    const DType out = program->result_dtype();
    std::vector<uint8_t> cpu_out, gpu_out;
    RunBoth(
        inputs, n * DTypeSize(out),
        [&](Backend& b, Stream& s, std::vector<DeviceMemory>& in, DeviceMemory& o) -> absl::Status {
          std::vector<const DeviceMemory*> ptrs = {&in[0], &in[1]};
          return b.Elementwise(s, *program, ptrs, o, out, n).status();
        },
        &cpu_out, &gpu_out);
    ExpectAgree(out, cpu_out, gpu_out, c.ulps,
                absl::StrCat(c.text, " (", DTypeName(c.x), ", ", DTypeName(c.y), ")"));
  }
}

TEST_F(CudaVsCpu, ReduceAgrees) {
  const ReduceShape shapes[] = {{1, 1000003, 1}, {1, 1, 1},   {37, 1001, 1},
                                {1, 513, 1027},  {5, 77, 33}, {4096, 3, 1}};
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kBool}) {
    for (const ReduceShape& shape : shapes) {
      const size_t n = shape.outer * shape.extent * shape.inner;
      // Products of many values over/underflow; keep them near 1 so they stay finite.
      for (ReduceKind kind : kShapeReduceKinds) {
        if (kind == ReduceKind::kProd && dtype != DType::kBool && n > 5000) continue;
        std::vector<uint8_t> in = VisitDType(dtype, [&](auto zero) {
          using T = decltype(zero);
          // Float sums and products in different orders agree within rounding only
          // without cancellation (and products only near 1): positive values there.
          if (std::is_floating_point_v<T> && kind != ReduceKind::kMin && kind != ReduceKind::kMax &&
              kind != ReduceKind::kArgmin && kind != ReduceKind::kArgmax) {
            return AsBytes(RandomValues<T>(n, 3, 0.5, 1.5));
          }
          return AsBytes(RandomValues<T>(n, 3));
        });
        const DType out = ReduceResultDType(kind, dtype);
        std::vector<uint8_t> cpu_out, gpu_out;
        RunBoth(
            {in}, shape.outer * shape.inner * DTypeSize(out),
            [&](Backend& b, Stream& s, std::vector<DeviceMemory>& ins, DeviceMemory& o) {
              return b.Reduce(s, kind, dtype, ins[0], shape, o);
            },
            &cpu_out, &gpu_out);
        const bool float_sum = IsFloat(out) && kind != ReduceKind::kMin && kind != ReduceKind::kMax;
        // Float sums accumulate in float64 on both, in different orders: a float64 result
        // of n positive terms may differ by ~sqrt(n) roundings, a float32 one is one rounding
        // of nearly the same value. Float32 products round at every step on both: each is
        // within (n - 1) 2^-24 of the exact product, less than n - 1 ulps of it.
        int ulps = !float_sum ? 0 : (out == DType::kFloat32 ? 1 : 1024);
        if (kind == ReduceKind::kProd && out == DType::kFloat32)
          ulps = static_cast<int>(2 * shape.extent);
        ExpectAgree(
            out, cpu_out, gpu_out, ulps,
            absl::StrCat("reduce kind ", static_cast<int>(kind), " of ", DTypeName(dtype),
                         " shape {", shape.outer, ",", shape.extent, ",", shape.inner, "}"));
      }
    }
  }
}

// Float32 products are taken in float32 on both backends (kernels/reduce_ops.h), in
// different orders, so each result is within gamma(n - 1) = (n - 1) u / (1 - (n - 1) u),
// u = 2^-24, of the exact product and the two within twice that of each other. The factors
// are 2^y with |y| in [0.05, 0.15] and a random sign: the products stay far from overflow in
// any order, and a factor left out or counted twice would move a product by at least 3.5%,
// well beyond the bound (at most 0.24% here). One shape per path of kernels/cuda/reduce.cu:
// short segments, a long segment cut into chunks, strided.
TEST_F(CudaVsCpu, Float32ProdAgreesWithinFloat32Rounding) {
  const ReduceShape shapes[] = {{64, 1000, 1}, {1, 20000, 1}, {3, 1000, 33}};
  for (const ReduceShape& shape : shapes) {
    const int64_t n = shape.outer * shape.extent * shape.inner;
    std::mt19937_64 rng(static_cast<uint64_t>(n));
    std::vector<float> in(n);
    for (float& x : in) {
      const double y = std::uniform_real_distribution<double>(0.05, 0.15)(rng);
      x = static_cast<float>(std::exp2((rng() & 1) ? y : -y));
    }
    std::vector<uint8_t> cpu_out, gpu_out;
    RunBoth(
        {AsBytes(in)}, shape.outer * shape.inner * sizeof(float),
        [&](Backend& b, Stream& s, std::vector<DeviceMemory>& ins, DeviceMemory& o) {
          return b.Reduce(s, ReduceKind::kProd, DType::kFloat32, ins[0], shape, o);
        },
        &cpu_out, &gpu_out);
    const std::vector<float> cpu = FromBytes<float>(cpu_out);
    const std::vector<float> gpu = FromBytes<float>(gpu_out);
    const double k = static_cast<double>(shape.extent - 1) * 0x1.0p-24;
    const double gamma = k / (1 - k);
    for (int64_t o = 0; o < shape.outer; ++o) {
      for (int64_t i = 0; i < shape.inner; ++i) {
        long double exact = 1;
        for (int64_t r = 0; r < shape.extent; ++r)
          exact *= in[(o * shape.extent + r) * shape.inner + i];
        const double p = static_cast<double>(exact);
        const size_t j = o * shape.inner + i;
        const std::string what =
            absl::StrCat("output ", j, " of {", shape.outer, ",", shape.extent, ",", shape.inner,
                         "}: exact ", p, " cpu ", cpu[j], " gpu ", gpu[j]);
        EXPECT_LE(std::fabs(cpu[j] - p), gamma * p) << what;
        EXPECT_LE(std::fabs(gpu[j] - p), gamma * p) << what;
        EXPECT_LE(std::fabs(gpu[j] - static_cast<double>(cpu[j])), 2 * gamma * p) << what;
      }
    }
  }
}

// Three factors take one accumulator in order on both backends (kernels/cuda/reduce.cu
// gives a segment this short a single lane), so a float32 running product that overflows
// part way is inf on both, as in NumPy; float64 products, or float32 ones taken in float64,
// would be 2^100.
TEST_F(CudaVsCpu, Float32ProdOverflowsPartWayLikeTheCpu) {
  const std::vector<float> in = {0x1p100f, 0x1p100f, 0x1p-100f};
  std::vector<uint8_t> cpu_out, gpu_out;
  RunBoth(
      {AsBytes(in)}, sizeof(float),
      [&](Backend& b, Stream& s, std::vector<DeviceMemory>& ins, DeviceMemory& o) {
        return b.Reduce(s, ReduceKind::kProd, DType::kFloat32, ins[0], ReduceShape{1, 3, 1}, o);
      },
      &cpu_out, &gpu_out);
  EXPECT_EQ(FromBytes<float>(cpu_out)[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(FromBytes<float>(gpu_out)[0], std::numeric_limits<float>::infinity());

  const std::vector<double> in64(in.begin(), in.end());
  RunBoth(
      {AsBytes(in64)}, sizeof(double),
      [&](Backend& b, Stream& s, std::vector<DeviceMemory>& ins, DeviceMemory& o) {
        return b.Reduce(s, ReduceKind::kProd, DType::kFloat64, ins[0], ReduceShape{1, 3, 1}, o);
      },
      &cpu_out, &gpu_out);
  EXPECT_EQ(FromBytes<double>(cpu_out)[0], 0x1p100);
  EXPECT_EQ(FromBytes<double>(gpu_out)[0], 0x1p100);
}

TEST_F(CudaVsCpu, ArgReduceOfFArrayAgrees) {
  constexpr int64_t rows = 333, cols = 517;
  for (DType dtype : {DType::kFloat32, DType::kInt32, DType::kBool}) {
    std::vector<uint8_t> in = VisitDType(dtype, [&](auto zero) {
      // Few distinct values: many ties, which C order must break.
      return AsBytes(RandomValues<decltype(zero)>(rows * cols, 11, -0.003, 0.003));
    });
    for (ReduceKind kind : {ReduceKind::kArgmin, ReduceKind::kArgmax}) {
      ReduceShape shape{1, rows * cols, 1, rows};
      std::vector<uint8_t> cpu_out, gpu_out;
      RunBoth(
          {in}, 8,
          [&](Backend& b, Stream& s, std::vector<DeviceMemory>& ins, DeviceMemory& o) {
            return b.Reduce(s, kind, dtype, ins[0], shape, o);
          },
          &cpu_out, &gpu_out);
      ExpectAgree(DType::kInt64, cpu_out, gpu_out, 0,
                  absl::StrCat("F-order arg reduce of ", DTypeName(dtype)));
    }
  }
}

TEST_F(CudaVsCpu, GemvAgrees) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (bool col_major : {false, true}) {
      for (bool transpose : {false, true}) {
        for (double beta : {0.0, 0.5}) {
          const GemvShape shape{257, 1031, col_major, transpose};
          const int64_t x_len = transpose ? shape.rows : shape.cols;
          const int64_t y_len = transpose ? shape.cols : shape.rows;
          std::vector<std::vector<uint8_t>> inputs = VisitDType(dtype, [&](auto zero) {
            using T = Stored<decltype(zero)>;
            std::vector<T> y = RandomValues<T>(y_len, 3);
            // With beta 0, y must not be read: NaN there must not reach the result.
            if (beta == 0) y.assign(y_len, std::numeric_limits<T>::quiet_NaN());
            return std::vector<std::vector<uint8_t>>{
                AsBytes(RandomValues<T>(shape.rows * shape.cols, 1)),
                AsBytes(RandomValues<T>(x_len, 2)), AsBytes(y)};
          });
          std::vector<uint8_t> cpu_out, gpu_out;
          RunBoth(
              inputs, y_len * DTypeSize(dtype),
              [&](Backend& b, Stream& s, std::vector<DeviceMemory>& in, DeviceMemory& o) {
                absl::Status st = b.Copy(s, in[2], 0, o, 0, y_len * DTypeSize(dtype));
                if (!st.ok()) return st;
                return b.Gemv(s, dtype, shape, 1.5, in[0], in[1], beta, o);
              },
              &cpu_out, &gpu_out);
          // Dot products of ~1000 terms in different orders: compare against the sum of
          // magnitudes, which bounds the rounding of either order.
          const double eps = dtype == DType::kFloat32 ? 6e-8 : 1.1e-16;
          VisitDType(dtype, [&](auto zero) {
            using T = Stored<decltype(zero)>;
            const std::vector<T> c = FromBytes<T>(cpu_out), g = FromBytes<T>(gpu_out);
            for (int64_t i = 0; i < y_len; ++i) {
              ASSERT_FALSE(std::isnan(static_cast<double>(g[i]))) << "element " << i;
              const double bound = 1.5 * 16.0 * 4.0 * static_cast<double>(x_len) * 4 * eps +
                                   8 * eps * std::fabs(c[i]);
              ASSERT_NEAR(c[i], g[i], bound)
                  << DTypeName(dtype) << " col_major " << col_major << " transpose " << transpose
                  << " beta " << beta << " element " << i;
            }
          });
        }
      }
    }
  }
}

TEST_F(CudaVsCpu, RandomAgrees) {
  struct Case {
    Distribution distribution;
    DType dtype;
    int ulps;
  };
  const Case cases[] = {
      {Distribution::kUniform, DType::kFloat32, 0}, {Distribution::kUniform, DType::kFloat64, 0},
      {Distribution::kIntegers, DType::kInt32, 0},  {Distribution::kIntegers, DType::kInt64, 0},
      {Distribution::kNormal, DType::kFloat32, 4},  {Distribution::kNormal, DType::kFloat64, 4}};
  for (const Case& c : cases) {
    RandomParams params;
    params.distribution = c.distribution;
    params.seed = 0x1234567890abcdefull;
    params.offset = 12345;
    params.mean = 0;  // mean + stddev * z with mean != 0 cancels; the suite checks means
    params.stddev = 2.0;
    params.low = -1000;
    params.high = c.dtype == DType::kInt64 ? (int64_t{1} << 40) : 77777;
    constexpr int64_t n = 1000003;
    std::vector<uint8_t> cpu_out, gpu_out;
    RunBoth(
        {}, n * DTypeSize(c.dtype),
        [&](Backend& b, Stream& s, std::vector<DeviceMemory>&, DeviceMemory& o) {
          return b.Random(s, params, c.dtype, o, n);
        },
        &cpu_out, &gpu_out);
    ExpectAgree(c.dtype, cpu_out, gpu_out, c.ulps,
                absl::StrCat("random distribution ", static_cast<int>(c.distribution), " ",
                             DTypeName(c.dtype)));
  }
}

TEST_F(CudaVsCpu, StagedTransfersOfManyBlocksRoundTrip) {
  // Larger than several staging blocks, at an odd offset, so pieces and tails both occur.
  constexpr size_t kBytes = (40 << 20) + 12345;
  std::vector<uint8_t> data(kBytes);
  std::mt19937_64 rng(5);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  ASSIGN_OR_FAIL(DeviceMemory mem, gpu_->Allocate(0, kBytes + 999));
  ASSERT_OK(gpu_->CopyFromHost(*gpu_stream_, data.data(), mem, 999, kBytes));
  ASSIGN_OR_FAIL(std::vector<uint8_t> back,
                 Download<uint8_t>(*gpu_, *gpu_stream_, mem, kBytes, 999));
  EXPECT_TRUE(back == data);
}

TEST_F(CudaVsCpu, PoolReportsUsageAndTrims) {
  const PoolUsage before = gpu_->MemoryPoolUsage(0);
  constexpr uint64_t kBytes = 512ull << 20;
  {
    ASSIGN_OR_FAIL(DeviceMemory mem, gpu_->Allocate(0, kBytes));
    const PoolUsage during = gpu_->MemoryPoolUsage(0);
    EXPECT_GE(during.used_bytes, before.used_bytes + kBytes);
    EXPECT_GE(during.reserved_bytes, during.used_bytes);
  }
  ASSERT_OK(Synchronize(*gpu_stream_));
  // The default threshold keeps freed memory for reuse...
  ASSIGN_OR_FAIL(PoolUsage kept, gpu_->TrimMemoryPool(0, UINT64_MAX));
  EXPECT_GE(kept.reserved_bytes, kBytes);
  ASSIGN_OR_FAIL(kept, gpu_->TrimMemoryPool(0, kBytes));
  EXPECT_GE(kept.reserved_bytes, kBytes);
  EXPECT_EQ(kept.used_bytes, before.used_bytes);
  // ...until trimmed.
  ASSIGN_OR_FAIL(PoolUsage trimmed, gpu_->TrimMemoryPool(0, 0));
  EXPECT_LT(trimmed.reserved_bytes, kBytes);
  EXPECT_EQ(gpu_->TrimMemoryPool(99, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaVsCpu, SmallBlocksAreReusedUncountedAndTrimmed) {
  ASSIGN_OR_FAIL(PoolUsage start, gpu_->TrimMemoryPool(0, 0));
  void* first = nullptr;
  {
    ASSIGN_OR_FAIL(DeviceMemory mem, gpu_->Allocate(0, 3000));
    first = mem.data();
    EXPECT_GE(gpu_->MemoryPoolUsage(0).used_bytes, start.used_bytes + 3000);
  }
  // Freed, the block is kept for reuse, not counted as used...
  EXPECT_EQ(gpu_->MemoryPoolUsage(0).used_bytes, start.used_bytes);
  {
    // ...and serves the next allocation of its size class (3000 and 4096 bytes share one),
    // which works as any other memory.
    ASSIGN_OR_FAIL(DeviceMemory again, gpu_->Allocate(0, 4096));
    EXPECT_EQ(again.data(), first);
    const std::vector<int32_t> data = RandomValues<int32_t>(1024, 5);
    ASSERT_OK(gpu_->CopyFromHost(*gpu_stream_, data.data(), again, 0, 4096));
    ASSIGN_OR_FAIL(std::vector<int32_t> back, Download<int32_t>(*gpu_, *gpu_stream_, again, 1024));
    EXPECT_EQ(back, data);
    // A larger class does not take it.
    ASSIGN_OR_FAIL(DeviceMemory other, gpu_->Allocate(0, 8192));
    EXPECT_NE(other.data(), first);
  }
  ASSERT_OK(Synchronize(*gpu_stream_));
  // Trimming gives the kept blocks back to the device with the rest.
  ASSIGN_OR_FAIL(PoolUsage trimmed, gpu_->TrimMemoryPool(0, 0));
  EXPECT_EQ(trimmed.used_bytes, start.used_bytes);
  EXPECT_LE(trimmed.reserved_bytes, start.reserved_bytes);
}

TEST_F(CudaVsCpu, OutOfMemoryIsResourceExhaustedAndLeavesTheBackendHealthy) {
  const uint64_t too_much = gpu_->devices()[0].total_memory_bytes * 2;
  absl::StatusOr<DeviceMemory> mem = gpu_->Allocate(0, too_much);
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), absl::StatusCode::kResourceExhausted) << mem.status();
  EXPECT_OK(gpu_->health());
  const std::vector<float> data = {1, 2, 3};
  ASSIGN_OR_FAIL(DeviceMemory small, Upload<float>(*gpu_, *gpu_stream_, data));
  ASSIGN_OR_FAIL(std::vector<float> back, Download<float>(*gpu_, *gpu_stream_, small, 3));
  EXPECT_EQ(back, data);
}

TEST_F(CudaVsCpu, InitialReservationAndReleaseThreshold) {
  cuda::CudaBackendOptions options;
  options.pool_initial_bytes = 256ull << 20;
  options.pool_release_threshold_bytes = 0;
  ASSIGN_OR_FAIL(std::unique_ptr<Backend> backend, cuda::CreateCudaBackend(options));
  EXPECT_GE(backend->MemoryPoolUsage(0).reserved_bytes, options.pool_initial_bytes);
  EXPECT_EQ(backend->MemoryPoolUsage(0).used_bytes, 0u);
}

TEST_F(CudaVsCpu, KernelsAreCachedInMemoryAndOnDisk) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("gpucompute-kernel-cache-", getpid());
  std::filesystem::remove_all(dir);
  // The scalar's value is a launch argument: one kernel serves every value.
  expr::InputMap types{{"a", expr::ScalarInput{DType::kFloat64, 2.5}},
                       {"x", expr::ArrayInput{DType::kFloat32}}};
  ASSIGN_OR_FAIL(expr::Program program, expr::Compile("a * x + 1", types));
  types["a"] = expr::ScalarInput{DType::kFloat64, -7.0};
  ASSIGN_OR_FAIL(expr::Program other_value, expr::Compile("a * x + 1", types));
  double first = 0, second = 0, third = 0, from_disk = 0;
  {
    cuda::CudaBackendOptions options;
    options.kernel_cache_dir = dir.string();
    ASSIGN_OR_FAIL(std::unique_ptr<Backend> backend, cuda::CreateCudaBackend(options));
    ASSIGN_OR_FAIL(first, backend->PrepareElementwise(program, DType::kFloat32));
    ASSIGN_OR_FAIL(second, backend->PrepareElementwise(program, DType::kFloat32));
    ASSIGN_OR_FAIL(third, backend->PrepareElementwise(other_value, DType::kFloat32));
  }
  EXPECT_GT(first, 0);
  EXPECT_EQ(second, 0);
  EXPECT_EQ(third, 0);
  EXPECT_FALSE(std::filesystem::is_empty(dir));
  {
    cuda::CudaBackendOptions options;
    options.kernel_cache_dir = dir.string();
    ASSIGN_OR_FAIL(std::unique_ptr<Backend> backend, cuda::CreateCudaBackend(options));
    ASSIGN_OR_FAIL(from_disk, backend->PrepareElementwise(program, DType::kFloat32));
    // Loading a cached binary skips NVRTC altogether.
    EXPECT_LT(from_disk, first);
    // And it computes: 2.5 * x + 1 and -7 * x + 1 from the one kernel.
    ASSIGN_OR_FAIL(std::unique_ptr<Stream> stream, backend->CreateStream(0));
    const std::vector<float> x = {1, 2, -3};
    ASSIGN_OR_FAIL(DeviceMemory in, Upload<float>(*backend, *stream, x));
    ASSIGN_OR_FAIL(DeviceMemory out, backend->Allocate(0, 12));
    const DeviceMemory* inputs[] = {nullptr, &in};
    ASSIGN_OR_FAIL(LaunchInfo info,
                   backend->Elementwise(*stream, program, inputs, out, DType::kFloat32, 3));
    EXPECT_EQ(info.compile_seconds, 0);
    ASSIGN_OR_FAIL(std::vector<float> y, Download<float>(*backend, *stream, out, 3));
    EXPECT_EQ(y, (std::vector<float>{3.5f, 6.0f, -6.5f}));
    ASSERT_OK(backend->Elementwise(*stream, other_value, inputs, out, DType::kFloat32, 3).status());
    ASSIGN_OR_FAIL(y, Download<float>(*backend, *stream, out, 3));
    EXPECT_EQ(y, (std::vector<float>{-6.0f, -13.0f, 22.0f}));
  }
  std::filesystem::remove_all(dir);
}

TEST_F(CudaVsCpu, EveryDeviceComputes) {
  for (const DeviceDescription& d : gpu_->devices()) {
    SCOPED_TRACE(absl::StrCat("device ", d.index, " ", d.name));
    EXPECT_GT(d.peak_bandwidth_gbps, 100);
    EXPECT_GT(d.compute_units, 0);
    ASSIGN_OR_FAIL(std::unique_ptr<Stream> stream, gpu_->CreateStream(d.index));
    EXPECT_EQ(stream->device(), d.index);
    ASSIGN_OR_FAIL(DeviceMemory mem, gpu_->Allocate(d.index, 1000 * 8));
    EXPECT_EQ(mem.device(), d.index);
    RandomParams params;
    params.distribution = Distribution::kIntegers;
    params.low = 0;
    params.high = 10;
    ASSERT_OK(gpu_->Random(*stream, params, DType::kInt64, mem, 1000));
    ASSIGN_OR_FAIL(DeviceMemory sum, gpu_->Allocate(d.index, 8));
    ASSERT_OK(
        gpu_->Reduce(*stream, ReduceKind::kSum, DType::kInt64, mem, ReduceShape{1, 1000, 1}, sum));
    ASSIGN_OR_FAIL(std::vector<int64_t> values, Download<int64_t>(*gpu_, *stream, mem, 1000));
    ASSIGN_OR_FAIL(std::vector<int64_t> total, Download<int64_t>(*gpu_, *stream, sum, 1));
    int64_t expected = 0;
    for (int64_t v : values) expected += v;
    EXPECT_EQ(total[0], expected);
  }
  EXPECT_EQ(gpu_->Allocate(static_cast<int>(gpu_->devices().size()), 8).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every device is warmed at start, not only the first: the first copy each way (through
// the small and the large staging blocks, and from pinned host staging) and the first
// matmul on any device take about as long as the second. Cold, a device's first copy
// took milliseconds where a warm one takes microseconds. On a machine with one GPU this
// checks device 0 only; run it on two or more to check the rest.
TEST_F(CudaVsCpu, EveryDeviceIsWarmAtStart) {
  constexpr uint64_t kLarge = 256 << 10;  // past the small staging blocks
  constexpr int64_t kN = 64;
  std::vector<char> host(kLarge, 1);
  for (const DeviceDescription& d : gpu_->devices()) {
    SCOPED_TRACE(absl::StrCat("device ", d.index, " ", d.name));
    ASSIGN_OR_FAIL(std::unique_ptr<Stream> stream, gpu_->CreateStream(d.index));
    ASSIGN_OR_FAIL(DeviceMemory mem, gpu_->Allocate(d.index, kLarge));
    ASSIGN_OR_FAIL(DeviceMemory pinned, gpu_->AllocateHostStaging(kLarge));
    ASSIGN_OR_FAIL(DeviceMemory a, gpu_->Allocate(d.index, kN * kN * 4));
    ASSIGN_OR_FAIL(DeviceMemory c, gpu_->Allocate(d.index, kN * kN * 4));
    MatmulShape square;
    square.m = square.n = square.k = kN;
    square.a = square.b = square.c = MatrixLayout{0, kN, 1, 0};
    const std::vector<std::pair<std::string, std::function<absl::Status()>>> ops = {
        {"small upload", [&] { return gpu_->CopyFromHost(*stream, host.data(), mem, 0, 64); }},
        {"small download", [&] { return gpu_->CopyToHost(*stream, mem, 0, host.data(), 64); }},
        {"large upload", [&] { return gpu_->CopyFromHost(*stream, host.data(), mem, 0, kLarge); }},
        {"large download", [&] { return gpu_->CopyToHost(*stream, mem, 0, host.data(), kLarge); }},
        {"pinned upload",
         [&] { return gpu_->CopyFromPinnedHost(*stream, pinned.data(), mem, 0, kLarge); }},
        {"pinned download",
         [&] { return gpu_->CopyToPinnedHost(*stream, mem, 0, pinned.data(), kLarge); }},
        {"matmul",
         [&] { return gpu_->Matmul(*stream, DType::kFloat32, square, 1, a, a, 0, c).status(); }},
    };
    for (const auto& [what, op] : ops) {
      SCOPED_TRACE(what);
      double seconds[2];
      for (double& taken : seconds) {
        const auto start = std::chrono::steady_clock::now();
        ASSERT_OK(op());
        ASSERT_OK(Synchronize(*stream));
        taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      // A warm first run is as quick as the second, give or take the host's jitter.
      EXPECT_LT(seconds[0], std::max(4 * seconds[1], 300e-6))
          << "first " << seconds[0] * 1e6 << " us, second " << seconds[1] * 1e6 << " us";
    }
  }
}

// ---- server/cuda/cuda_check.h: needs no GPU, only the libraries' name tables.

bool Contains(const absl::Status& status, const std::string& part) {
  return std::string(status.message()).find(part) != std::string::npos;
}

// A run of operations launched together is recorded into a CUDA graph and timed by
// events around its launch. The host's recording must not count as device time: here
// recording the first launch takes 50 ms (it sleeps first), on an idle stream, and four
// fills of 1024 values take microseconds.
TEST_F(CudaVsCpu, ARecordedRunIsTimedFromItsLaunchNotFromItsRecording) {
  ASSIGN_OR_FAIL(std::unique_ptr<Executor> executor, Executor::Create(*gpu_));
  executor->SetCaptureMinOps(2);
  MemoryLimiter limiter(uint64_t{1} << 30);
  BufferRegistry registry(*gpu_, limiter);
  ASSIGN_OR_FAIL(BufferHandle x,
                 registry.Allocate("c", "", DType::kFloat32, {1024}, Layout::kC, 0));
  std::vector<std::shared_ptr<Operation>> ops;
  {
    Executor::LaunchBatch batch(*executor);
    for (int i = 0; i < 4; ++i) {
      Executor::OpSpec spec;
      spec.kind = OperationKind::kFill;
      spec.accesses = {{x, true}};
      spec.capturable = true;
      spec.launch = [this, x, i](Stream& stream, OpResult&) -> absl::StatusOr<LaunchInfo> {
        if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const float value = static_cast<float>(i);
        uint32_t bits = 0;
        std::memcpy(&bits, &value, sizeof(bits));
        RETURN_IF_ERROR(gpu_->Fill(stream, x->memory, DType::kFloat32, bits, 1024));
        return LaunchInfo{};
      };
      ASSIGN_OR_FAIL(std::shared_ptr<Operation> op, executor->Submit("c", "", std::move(spec)));
      ops.push_back(std::move(op));
    }
  }
  ASSERT_TRUE(executor->WaitIdle(absl::Now() + absl::Seconds(30)));
  double device_seconds = 0;
  for (const auto& op : ops) {
    const OperationStatus status = executor->GetStatus(*op);
    ASSERT_EQ(status.state, OperationStatus::State::kSucceeded) << status.error;
    EXPECT_EQ(status.timing.graph_operations, 4u) << "not recorded as one run";
    device_seconds += status.timing.device_seconds;
  }
  EXPECT_GT(device_seconds, 0);
  EXPECT_LT(device_seconds, 0.025) << "the host's recording was timed as device time";
}

TEST(CudaCheckTest, NamesTheCallTheErrorAndTheSiteAndMapsOutOfMemory) {
  EXPECT_TRUE(cuda::CudaStatus(cudaSuccess, "call", "f.cc", 1).ok());
  EXPECT_TRUE(cuda::CudaStatus(CUBLAS_STATUS_SUCCESS, "call", "f.cc", 1).ok());
  EXPECT_TRUE(cuda::CudaStatus(NVRTC_SUCCESS, "call", "f.cc", 1).ok());
  struct Case {
    absl::Status status;
    absl::StatusCode code;
    std::string name;
  };
  const Case cases[] = {
      {cuda::CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "f.cc", 12),
       absl::StatusCode::kResourceExhausted, "cudaErrorMemoryAllocation"},
      {cuda::CudaStatus(cudaErrorInvalidValue, "cudaMalloc(&p, n)", "f.cc", 12),
       absl::StatusCode::kInternal, "cudaErrorInvalidValue"},
      {cuda::CudaStatus(CUBLAS_STATUS_ALLOC_FAILED, "cudaMalloc(&p, n)", "f.cc", 12),
       absl::StatusCode::kResourceExhausted, "CUBLAS_STATUS_ALLOC_FAILED"},
      {cuda::CudaStatus(CUBLAS_STATUS_INVALID_VALUE, "cudaMalloc(&p, n)", "f.cc", 12),
       absl::StatusCode::kInternal, "CUBLAS_STATUS_INVALID_VALUE"},
      {cuda::CudaStatus(NVRTC_ERROR_OUT_OF_MEMORY, "cudaMalloc(&p, n)", "f.cc", 12),
       absl::StatusCode::kResourceExhausted, "NVRTC_ERROR_OUT_OF_MEMORY"},
      {cuda::CudaStatus(NVRTC_ERROR_INVALID_OPTION, "cudaMalloc(&p, n)", "f.cc", 12),
       absl::StatusCode::kInternal, "NVRTC_ERROR_INVALID_OPTION"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.status;
    EXPECT_TRUE(Contains(c.status, "cudaMalloc(&p, n) failed with " + c.name)) << c.status;
    EXPECT_TRUE(Contains(c.status, " at f.cc:12")) << c.status;
  }
}

cudaError_t Returns(cudaError_t error) { return error; }

absl::Status CheckedCall(cudaError_t error, int* reached) {
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(Returns(error));
  ++*reached;
  return absl::OkStatus();
}

absl::Status CheckedCallVia(cudaError_t error, int* checked) {
  auto check = [&](cudaError_t e, const char* call, const char* file, int line) {
    ++*checked;
    return cuda::CudaStatus(e, call, file, line);
  };
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(check, Returns(error));
  return absl::OkStatus();
}

TEST(CudaCheckTest, MacroReturnsTheFirstFailureWithItsCallText) {
  int reached = 0;
  EXPECT_TRUE(CheckedCall(cudaSuccess, &reached).ok());
  EXPECT_EQ(reached, 1);
  const absl::Status failed = CheckedCall(cudaErrorMemoryAllocation, &reached);
  EXPECT_EQ(reached, 1);
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(failed, "Returns(error) failed with cudaErrorMemoryAllocation")) << failed;
  EXPECT_TRUE(Contains(failed, "cuda_backend_test.cc:")) << failed;

  int checked = 0;
  EXPECT_EQ(CheckedCallVia(cudaErrorInvalidValue, &checked).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(checked, 1);
}

}  // namespace
}  // namespace gpucompute
