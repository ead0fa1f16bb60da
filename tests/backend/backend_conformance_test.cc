// The Backend conformance suite (see tests/backend/backend_conformance.h), instantiated here for
// the CPU backend with 3 threads and with 1 thread.
//
// Every expected value is computed in this file with plain loops, in float64 or with
// exact (wrapping) integer arithmetic, from the definitions in server/core/backend.h,
// kernels/ops.h, kernels/philox.h and server/expression/expression.h; no backend kernel
// is called to produce a reference.
#include "tests/backend/backend_conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "server/core/backend.h"
#include "server/cpu/cpu_backend.h"
#include "server/expression/expression.h"
#include "tests/support/element_bytes.h"
#if defined(GPUCOMPUTE_HAVE_CUDA)
#include "server/cuda/cuda_backend.h"
#endif

namespace gpucompute::conformance {
namespace {

using ::gpucompute::testing::ElementAsDouble;
using ::gpucompute::testing::ElementAsInt;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Tolerances against float64 references. Float64 results of a few operations are within
// a few ulp (2.2e-16 each); float32 results of a few operations within a few float32 ulp
// (6e-8 each) of the exact value.
constexpr double kFloat64Rel = 1e-12;
constexpr double kFloat64Abs = 1e-300;
constexpr double kFloat32Rel = 2e-6;

// Bools are stored as one byte on the host as on the device.
template <typename T>
using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

template <typename T>
constexpr double RelTol() {
  return std::is_same_v<T, float> ? kFloat32Rel : kFloat64Rel;
}

// splitmix64: fast, and good enough to make test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(Next() >> 11) * 0x1.0p-53);
  }
  // In [lo, hi], for hi - lo < 2^63.
  int64_t Int(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

template <typename T>
std::vector<T> UniformVector(int64_t n, double lo, double hi, uint64_t seed) {
  Rng rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(rng.Uniform(lo, hi));
  return v;
}

// Integers over the full range of T (so that sums and products wrap).
template <typename T>
std::vector<T> FullRangeVector(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(rng.Next());
  return v;
}

template <typename T>
std::vector<T> IntVector(int64_t n, int64_t lo, int64_t hi, uint64_t seed) {
  Rng rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(rng.Int(lo, hi));
  return v;
}

// A byte pattern no operation writes by accident, for the elements past an output.
template <typename T>
T GuardValue() {
  T value;
  std::memset(&value, 0xA5, sizeof(T));
  return value;
}
constexpr size_t kGuardElements = 7;

template <typename T>
bool SameBits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Expects got[i] within max(rtol * |want[i]|, atol) of want[i] for every i; NaN matches NaN
// and an infinity only itself. Reports the first few mismatches and their count.
template <typename T>
void ExpectAllClose(std::span<const T> got, std::span<const double> want, double rtol,
                    double atol) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = want[i];
    bool ok;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else {
      ok = std::fabs(g - w) <= std::max(rtol * std::fabs(w), atol);
    }
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << " of " << got.size() << ": got " << g << ", want " << w
                    << " (rel error " << std::fabs(g - w) / std::fabs(w) << ", rtol " << rtol
                    << ")";
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

template <typename T>
void ExpectAllClose(const std::vector<T>& got, const std::vector<double>& want, double rtol,
                    double atol) {
  ExpectAllClose(std::span<const T>(got), std::span<const double>(want), rtol, atol);
}

// Expects got == want bit for bit.
template <typename T>
void ExpectAllSame(const std::vector<T>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!SameBits(got[i], want[i]) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << " of " << got.size() << ": got " << +got[i] << ", want "
                    << +want[i];
    }
  }
  EXPECT_EQ(bad, 0) << "elements differ";
}

template <typename T>
void ExpectGuardIntact(std::span<const T> guard) {
  const T g = GuardValue<T>();
  for (size_t i = 0; i < guard.size(); ++i) {
    ASSERT_TRUE(SameBits(guard[i], g))
        << "the operation wrote element " << i << " past the end of its output";
  }
}

// ---------------------------------------------------------------------------------
// Elementwise helpers
// ---------------------------------------------------------------------------------

using ArrayMap = std::map<std::string, const DeviceMemory*, std::less<>>;

// The inputs of `program` in its order, with null for scalars.
absl::StatusOr<std::vector<const DeviceMemory*>> BindInputs(const expr::Program& program,
                                                            const ArrayMap& arrays) {
  std::vector<const DeviceMemory*> bound;
  for (size_t k = 0; k < program.inputs().size(); ++k) {
    if (std::holds_alternative<expr::ScalarInput>(program.input_types()[k])) {
      bound.push_back(nullptr);
      continue;
    }
    auto it = arrays.find(program.inputs()[k]);
    if (it == arrays.end()) {
      return absl::InvalidArgumentError(absl::StrCat("no array for ", program.inputs()[k]));
    }
    bound.push_back(it->second);
  }
  return bound;
}

// Runs `program` over n elements into a fresh output of R (bool as uint8_t) followed by
// guard elements, checks the guard, and returns the n results.
template <typename R>
absl::StatusOr<std::vector<Stored<R>>> RunElementwise(Backend& backend, Stream& stream,
                                                      const expr::Program& program,
                                                      const ArrayMap& arrays, int64_t n) {
  using S = Stored<R>;
  absl::StatusOr<std::vector<const DeviceMemory*>> inputs = BindInputs(program, arrays);
  if (!inputs.ok()) return inputs.status();
  const S guard = GuardValue<S>();
  absl::StatusOr<DeviceMemory> out = Upload<S>(backend, stream, std::span<const S>(),
                                               static_cast<size_t>(n) + kGuardElements, &guard);
  if (!out.ok()) return out.status();
  absl::StatusOr<LaunchInfo> info =
      backend.Elementwise(stream, program, *inputs, *out, DTypeOf<R>::value, n);
  if (!info.ok()) return info.status();
  EXPECT_GE(info->compile_seconds, 0.0);
  absl::StatusOr<std::vector<S>> all =
      Download<S>(backend, stream, *out, static_cast<size_t>(n) + kGuardElements);
  if (!all.ok()) return all.status();
  ExpectGuardIntact(std::span<const S>(*all).subspan(static_cast<size_t>(n)));
  all->resize(static_cast<size_t>(n));
  return *std::move(all);
}

// Checks `text` over arrays x (X) and y (Y): the program's result dtype is R, and the
// backend's output equals ref(x[i], y[i]) exactly (integer and bool R) or within rtol
// (float R; ref returns the float64 reference).
template <typename R, typename X, typename Y, typename Ref>
void CheckBinary(Backend& backend, Stream& stream, absl::string_view text,
                 const std::vector<Stored<X>>& x, const std::vector<Stored<Y>>& y, Ref ref,
                 double rtol = 0) {
  SCOPED_TRACE(absl::StrCat(text, " with x ", DTypeName(DTypeOf<X>::value), ", y ",
                            DTypeName(DTypeOf<Y>::value), ", n ", x.size()));
  ASSERT_EQ(x.size(), y.size());
  ASSIGN_OR_FAIL(const expr::Program program,
                 expr::Compile(std::string_view(text.data(), text.size()),
                               {{"x", expr::ArrayInput{DTypeOf<X>::value}},
                                {"y", expr::ArrayInput{DTypeOf<Y>::value}}}));
  ASSERT_EQ(program.result_dtype(), DTypeOf<R>::value) << program.canonical();
  DeviceMemory dx, dy;
  ASSIGN_OR_FAIL(dx, Upload(backend, stream, x));
  ASSIGN_OR_FAIL(dy, Upload(backend, stream, y));
  std::vector<Stored<R>> got;
  ASSIGN_OR_FAIL(got, RunElementwise<R>(backend, stream, program, {{"x", &dx}, {"y", &dy}},
                                        static_cast<int64_t>(x.size())));
  if constexpr (IsFloat(DTypeOf<R>::value)) {
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = ref(x[i], y[i]);
    ExpectAllClose(got, want, rtol, kFloat64Abs);
  } else {
    std::vector<Stored<R>> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<Stored<R>>(ref(x[i], y[i]));
    ExpectAllSame(got, want);
  }
}

// Wrapping integer arithmetic, as the expression language defines it.
template <typename T>
T WrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
T WrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

// ---------------------------------------------------------------------------------
// Devices, memory and copies
// ---------------------------------------------------------------------------------

TEST_P(BackendConformance, DescribesDevices) {
  EXPECT_FALSE(backend().name().empty());
  const std::vector<DeviceDescription>& devices = backend().devices();
  for (size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(devices[i].index, static_cast<int>(i));
    EXPECT_FALSE(devices[i].name.empty());
    EXPECT_GT(devices[i].total_memory_bytes, 0u);
    EXPECT_GE(devices[i].compute_units, 1);
    EXPECT_GE(devices[i].peak_bandwidth_gbps, 0.0);
  }
  EXPECT_EQ(stream().device(), 0);
}

TEST_P(BackendConformance, AllocatesAlignedMemoryOfEverySize) {
  const std::vector<uint64_t> sizes = {0, 1, 3, 255, 256, 257, 4099, 1000003};
  std::vector<DeviceMemory> mems;
  std::vector<std::vector<uint8_t>> patterns;
  for (uint64_t bytes : sizes) {
    SCOPED_TRACE(absl::StrCat("bytes ", bytes));
    DeviceMemory mem;
    ASSIGN_OR_FAIL(mem, backend().Allocate(0, bytes));
    EXPECT_EQ(mem.size(), bytes);
    EXPECT_EQ(mem.device(), 0);
    if (bytes > 0) {
      EXPECT_NE(mem.data(), nullptr);
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(mem.data()) % 256, 0u) << mem.data();
    // Write a distinct pattern to every allocation before reading any back, so that
    // overlapping allocations would show.
    std::vector<uint8_t> pattern =
        IntVector<uint8_t>(static_cast<int64_t>(bytes), 0, 255, bytes + 1);
    if (bytes > 0) {
      ASSERT_OK(backend().CopyFromHost(stream(), pattern.data(), mem, 0, bytes));
    }
    mems.push_back(std::move(mem));
    patterns.push_back(std::move(pattern));
  }
  ASSERT_OK(Synchronize(stream()));
  for (size_t k = 0; k < sizes.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("bytes ", sizes[k]));
    std::vector<uint8_t> back;
    ASSIGN_OR_FAIL(back, Download<uint8_t>(backend(), stream(), mems[k], sizes[k]));
    EXPECT_TRUE(back == patterns[k]);
  }
}

TEST_P(BackendConformance, RejectsUnknownDevicesAndImpossibleSizes) {
  const int missing = static_cast<int>(backend().devices().size());
  EXPECT_EQ(backend().Allocate(missing, 16).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().Allocate(-1, 16).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().CreateStream(missing).status().code(), absl::StatusCode::kInvalidArgument);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers' host allocators abort on impossible sizes instead of failing them
  // (unless allocator_may_return_null=1), so a host-memory backend cannot be asked.
  GTEST_SKIP() << "impossible allocation sizes are not tried under a sanitizer";
#endif
  EXPECT_EQ(backend().Allocate(0, uint64_t{1} << 62).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend().Allocate(0, std::numeric_limits<uint64_t>::max()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_P(BackendConformance, CopiesHonourOffsets) {
  constexpr uint64_t kSizeA = 20011;
  constexpr uint64_t kSizeB = 9103;
  const std::vector<uint8_t> init_a(kSizeA, 0xEE);
  const std::vector<uint8_t> init_b(kSizeB, 0xDD);
  const std::vector<uint8_t> src = IntVector<uint8_t>(10007, 0, 255, 7);
  DeviceMemory a, b;
  ASSIGN_OR_FAIL(a, Upload(backend(), stream(), init_a));
  ASSIGN_OR_FAIL(b, Upload(backend(), stream(), init_b));
  // The same operations on host mirrors.
  std::vector<uint8_t> want_a = init_a;
  std::vector<uint8_t> want_b = init_b;
  std::vector<uint8_t> partial(1001, 0x11);
  std::vector<uint8_t> want_partial = partial;

  ASSERT_OK(backend().CopyFromHost(stream(), src.data(), a, 13, src.size()));
  std::memcpy(want_a.data() + 13, src.data(), src.size());
  ASSERT_OK(backend().Copy(stream(), a, 18, b, 7, 9000));
  std::memcpy(want_b.data() + 7, want_a.data() + 18, 9000);
  // Within one allocation, non-overlapping.
  ASSERT_OK(backend().Copy(stream(), a, 13, a, 15000, 5000));
  std::memcpy(want_a.data() + 15000, want_a.data() + 13, 5000);
  // Single bytes at the very ends, and empty copies that must change nothing.
  const uint8_t one = 0x42;
  ASSERT_OK(backend().CopyFromHost(stream(), &one, b, kSizeB - 1, 1));
  want_b[kSizeB - 1] = one;
  ASSERT_OK(backend().Copy(stream(), b, kSizeB - 1, a, 0, 1));
  want_a[0] = one;
  ASSERT_OK(backend().CopyFromHost(stream(), src.data(), a, 100, 0));
  ASSERT_OK(backend().Copy(stream(), a, 5, b, 5, 0));
  ASSERT_OK(backend().CopyToHost(stream(), b, 3, partial.data() + 10, 0));
  // To the host from an offset, into the middle of a host buffer.
  ASSERT_OK(backend().CopyToHost(stream(), b, 3, partial.data() + 10, 900));
  std::memcpy(want_partial.data() + 10, want_b.data() + 3, 900);
  ASSERT_OK(Synchronize(stream()));
  EXPECT_TRUE(partial == want_partial);

  std::vector<uint8_t> got_a, got_b;
  ASSIGN_OR_FAIL(got_a, Download<uint8_t>(backend(), stream(), a, kSizeA));
  ASSIGN_OR_FAIL(got_b, Download<uint8_t>(backend(), stream(), b, kSizeB));
  ExpectAllSame(got_a, want_a);
  ExpectAllSame(got_b, want_b);
  // Downloads from an offset read the same bytes.
  std::vector<uint8_t> tail;
  ASSIGN_OR_FAIL(tail, Download<uint8_t>(backend(), stream(), a, 11, kSizeA - 11));
  ExpectAllSame(tail, std::vector<uint8_t>(want_a.end() - 11, want_a.end()));
}

template <typename T>
void CheckFill(Backend& backend, Stream& stream, T value, int64_t count) {
  SCOPED_TRACE(absl::StrCat("fill ", DTypeName(DTypeOf<T>::value), " count ", count));
  using S = Stored<T>;
  const S guard = GuardValue<S>();
  DeviceMemory mem;
  ASSIGN_OR_FAIL(mem, Upload<S>(backend, stream, std::span<const S>(),
                                static_cast<size_t>(count) + kGuardElements, &guard));
  const S stored = static_cast<S>(value);
  uint64_t bits = 0;
  std::memcpy(&bits, &stored, sizeof(S));
  ASSERT_OK(backend.Fill(stream, mem, DTypeOf<T>::value, bits, count));
  std::vector<S> got;
  ASSIGN_OR_FAIL(got,
                 Download<S>(backend, stream, mem, static_cast<size_t>(count) + kGuardElements));
  ExpectGuardIntact(std::span<const S>(got).subspan(static_cast<size_t>(count)));
  got.resize(static_cast<size_t>(count));
  ExpectAllSame(got, std::vector<S>(static_cast<size_t>(count), stored));
}

TEST_P(BackendConformance, FillsEveryDType) {
  double nan_with_payload;
  const uint64_t payload_bits = 0x7FF8000000012345ull;
  std::memcpy(&nan_with_payload, &payload_bits, sizeof(double));
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1000003}}) {
    CheckFill<bool>(backend(), stream(), true, count);
    CheckFill<int32_t>(backend(), stream(), -123456789, count);
    CheckFill<int64_t>(backend(), stream(), -0x0123456789ABCDEFll, count);
    CheckFill<float>(backend(), stream(), -1.5e-7f, count);
    CheckFill<double>(backend(), stream(), -3.141592653589793, count);
    CheckFill<double>(backend(), stream(), nan_with_payload, count);
  }
}

// ---------------------------------------------------------------------------------
// Streams, events and callbacks
// ---------------------------------------------------------------------------------

TEST_P(BackendConformance, StreamRunsWorkInEnqueueOrder) {
  // Fill, then 50 times: copy x to y and x = y + 1. Any reordering leaves a smaller count
  // somewhere.
  constexpr int64_t kN = 1 << 16;
  constexpr int kSteps = 50;
  DeviceMemory x, y;
  ASSIGN_OR_FAIL(x, backend().Allocate(0, kN * sizeof(double)));
  ASSIGN_OR_FAIL(y, backend().Allocate(0, kN * sizeof(double)));
  ASSIGN_OR_FAIL(const expr::Program plus_one,
                 expr::Compile("y + 1", {{"y", expr::ArrayInput{DType::kFloat64}}}));
  const double zero = 0.0;
  uint64_t zero_bits;
  std::memcpy(&zero_bits, &zero, sizeof(zero));
  ASSERT_OK(backend().Fill(stream(), x, DType::kFloat64, zero_bits, kN));
  const DeviceMemory* inputs[] = {&y};
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_OK(backend().Copy(stream(), x, 0, y, 0, kN * sizeof(double)));
    ASSERT_OK(backend().Elementwise(stream(), plus_one, inputs, x, DType::kFloat64, kN).status());
  }
  std::vector<double> got;
  ASSIGN_OR_FAIL(got, Download<double>(backend(), stream(), x, kN));
  ExpectAllSame(got, std::vector<double>(kN, kSteps));
}

TEST_P(BackendConformance, IndependentStreamsRunConcurrently) {
  // Four streams each step their own buffers, with their work interleaved at enqueue.
  constexpr int kStreams = 4;
  constexpr int64_t kN = 1 << 16;
  constexpr int kSteps = 20;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<DeviceMemory> xs, ys;
  std::vector<expr::Program> programs;
  const std::vector<int64_t> zeros(kN, 0);
  for (int s = 0; s < kStreams; ++s) {
    std::unique_ptr<Stream> st;
    ASSIGN_OR_FAIL(st, backend().CreateStream(0));
    DeviceMemory x, y;
    ASSIGN_OR_FAIL(x, Upload(backend(), *st, zeros));
    ASSIGN_OR_FAIL(y, Upload(backend(), *st, zeros));
    ASSIGN_OR_FAIL(const expr::Program p, expr::Compile(absl::StrCat("x + ", s + 1),
                                                        {{"x", expr::ArrayInput{DType::kInt64}}}));
    streams.push_back(std::move(st));
    xs.push_back(std::move(x));
    ys.push_back(std::move(y));
    programs.push_back(std::move(p));
  }
  for (int step = 0; step < kSteps; ++step) {
    for (int s = 0; s < kStreams; ++s) {
      // Alternate x -> y and y -> x; kSteps is even, so the result ends in x.
      DeviceMemory& from = step % 2 == 0 ? xs[s] : ys[s];
      DeviceMemory& to = step % 2 == 0 ? ys[s] : xs[s];
      const DeviceMemory* inputs[] = {&from};
      ASSERT_OK(
          backend().Elementwise(*streams[s], programs[s], inputs, to, DType::kInt64, kN).status());
    }
  }
  for (int s = 0; s < kStreams; ++s) {
    SCOPED_TRACE(absl::StrCat("stream ", s));
    std::vector<int64_t> got;
    ASSIGN_OR_FAIL(got, Download<int64_t>(backend(), *streams[s], xs[s], kN));
    ExpectAllSame(got, std::vector<int64_t>(kN, int64_t{kSteps} * (s + 1)));
  }
}

TEST_P(BackendConformance, WaitOrdersWorkAcrossStreams) {
  // Stream A does 64 dependent passes over a large array, then records an event; stream
  // B waits for it and copies the array out. Without the wait B would run immediately,
  // long before A is done, and see a smaller count.
  constexpr int64_t kN = 1 << 20;
  constexpr int kSteps = 64;
  Stream& a = stream();
  std::unique_ptr<Stream> b;
  ASSIGN_OR_FAIL(b, backend().CreateStream(0));
  const std::vector<double> zeros(kN, 0.0);
  DeviceMemory x, y, copy;
  ASSIGN_OR_FAIL(x, Upload(backend(), a, zeros));
  ASSIGN_OR_FAIL(y, Upload(backend(), a, zeros));
  ASSIGN_OR_FAIL(copy, Upload(backend(), *b, zeros));
  ASSIGN_OR_FAIL(const expr::Program plus_one,
                 expr::Compile("v + 1", {{"v", expr::ArrayInput{DType::kFloat64}}}));
  for (int step = 0; step < kSteps; ++step) {
    const DeviceMemory* inputs[] = {step % 2 == 0 ? &x : &y};
    DeviceMemory& to = step % 2 == 0 ? y : x;
    ASSERT_OK(backend().Elementwise(a, plus_one, inputs, to, DType::kFloat64, kN).status());
  }
  std::shared_ptr<Event> done;
  ASSIGN_OR_FAIL(done, a.Record());
  ASSERT_OK(b->Wait(done));
  done.reset();  // the stream must keep what it waits for alive
  ASSERT_OK(backend().Copy(*b, x, 0, copy, 0, kN * sizeof(double)));
  std::vector<double> got;
  ASSIGN_OR_FAIL(got, Download<double>(backend(), *b, copy, kN));
  ExpectAllSame(got, std::vector<double>(kN, kSteps));
  ASSERT_OK(Synchronize(a));
}

TEST_P(BackendConformance, EventsOrderWorkBackAndForth) {
  // x = 1; then 10 times: B computes y = 2x after A's last step, A computes x = y + 1
  // after B's. The result is 2^11 - 1 only if every wait held.
  constexpr int64_t kN = 1 << 18;
  Stream& a = stream();
  std::unique_ptr<Stream> b;
  ASSIGN_OR_FAIL(b, backend().CreateStream(0));
  DeviceMemory x, y;
  ASSIGN_OR_FAIL(x, backend().Allocate(0, kN * sizeof(double)));
  ASSIGN_OR_FAIL(y, backend().Allocate(0, kN * sizeof(double)));
  ASSIGN_OR_FAIL(const expr::Program twice,
                 expr::Compile("2 * v", {{"v", expr::ArrayInput{DType::kFloat64}}}));
  ASSIGN_OR_FAIL(const expr::Program plus_one,
                 expr::Compile("v + 1", {{"v", expr::ArrayInput{DType::kFloat64}}}));
  const double one = 1.0;
  uint64_t one_bits;
  std::memcpy(&one_bits, &one, sizeof(one));
  ASSERT_OK(backend().Fill(a, x, DType::kFloat64, one_bits, kN));
  std::shared_ptr<Event> a_done;
  ASSIGN_OR_FAIL(a_done, a.Record());
  double want = 1.0;
  for (int round = 0; round < 10; ++round) {
    ASSERT_OK(b->Wait(a_done));
    const DeviceMemory* from_x[] = {&x};
    ASSERT_OK(backend().Elementwise(*b, twice, from_x, y, DType::kFloat64, kN).status());
    std::shared_ptr<Event> b_done;
    ASSIGN_OR_FAIL(b_done, b->Record());
    ASSERT_OK(a.Wait(b_done));
    const DeviceMemory* from_y[] = {&y};
    ASSERT_OK(backend().Elementwise(a, plus_one, from_y, x, DType::kFloat64, kN).status());
    ASSIGN_OR_FAIL(a_done, a.Record());
    want = 2 * want + 1;
  }
  std::vector<double> got;
  ASSIGN_OR_FAIL(got, Download<double>(backend(), a, x, kN));
  ExpectAllSame(got, std::vector<double>(kN, want));
  ASSERT_OK(Synchronize(*b));
}

TEST_P(BackendConformance, OnCompleteRunsAfterPriorWork) {
  // Each callback checks the host buffer that the copy enqueued just before it filled.
  constexpr int kRounds = 20;
  constexpr int64_t kN = 1 << 16;
  DeviceMemory dev;
  ASSIGN_OR_FAIL(dev, backend().Allocate(0, kN * sizeof(int32_t)));
  std::vector<std::vector<int32_t>> host(kRounds, std::vector<int32_t>(kN, -1));
  std::vector<std::promise<std::pair<absl::Status, int64_t>>> results(kRounds);
  for (int k = 0; k < kRounds; ++k) {
    ASSERT_OK(backend().Fill(stream(), dev, DType::kInt32, static_cast<uint64_t>(k), kN));
    ASSERT_OK(backend().CopyToHost(stream(), dev, 0, host[k].data(), kN * sizeof(int32_t)));
    ASSERT_OK(stream().OnComplete([&host, &results, k](absl::Status status) {
      const int64_t wrong =
          std::count_if(host[k].begin(), host[k].end(), [k](int32_t v) { return v != k; });
      results[k].set_value({status, wrong});
    }));
  }
  for (int k = 0; k < kRounds; ++k) {
    auto future = results[k].get_future();
    ASSERT_EQ(future.wait_for(std::chrono::seconds(120)), std::future_status::ready);
    const auto [status, wrong] = future.get();
    EXPECT_OK(status);
    EXPECT_EQ(wrong, 0) << "callback " << k << " ran before its copy finished";
  }
  ASSERT_OK(Synchronize(stream()));
}

TEST_P(BackendConformance, OnCompleteMayEnqueueWork) {
  // From inside a callback: more work on another stream and on the callback's own stream.
  constexpr int64_t kN = 4099;
  std::unique_ptr<Stream> other;
  ASSIGN_OR_FAIL(other, backend().CreateStream(0));
  DeviceMemory a, b;
  ASSIGN_OR_FAIL(a, backend().Allocate(0, kN * sizeof(int32_t)));
  ASSIGN_OR_FAIL(b, backend().Allocate(0, kN * sizeof(int32_t)));
  std::vector<int32_t> via_other(kN, 0), via_self(kN, 0);
  std::promise<absl::Status> enqueued, other_done, self_done;
  ASSERT_OK(backend().Fill(stream(), a, DType::kInt32, 7, kN));
  Backend* be = &backend();
  Stream* self = &stream();
  Stream* oth = other.get();
  ASSERT_OK(stream().OnComplete([&, be, self, oth](absl::Status status) {
    absl::Status s = status;
    if (s.ok()) s = be->Copy(*oth, a, 0, b, 0, kN * sizeof(int32_t));
    if (s.ok()) s = be->CopyToHost(*oth, b, 0, via_other.data(), kN * sizeof(int32_t));
    if (s.ok()) {
      s = oth->OnComplete([&other_done](absl::Status st) { other_done.set_value(st); });
    }
    if (s.ok()) s = be->CopyToHost(*self, a, 0, via_self.data(), kN * sizeof(int32_t));
    if (s.ok()) s = self->OnComplete([&self_done](absl::Status st) { self_done.set_value(st); });
    enqueued.set_value(s);
  }));
  auto wait = [](std::promise<absl::Status>& p) {
    auto f = p.get_future();
    if (f.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      return absl::DeadlineExceededError("callback never ran");
    }
    return f.get();
  };
  ASSERT_OK(wait(enqueued));
  ASSERT_OK(wait(other_done));
  ASSERT_OK(wait(self_done));
  ExpectAllSame(via_other, std::vector<int32_t>(kN, 7));
  ExpectAllSame(via_self, std::vector<int32_t>(kN, 7));
  ASSERT_OK(Synchronize(stream()));
  ASSERT_OK(Synchronize(*other));
}

TEST_P(BackendConformance, ElapsedSecondsBetweenEvents) {
  constexpr int64_t kN = 1 << 20;
  const std::vector<double> x = UniformVector<double>(kN, -1, 1, 3);
  DeviceMemory dx, dy;
  ASSIGN_OR_FAIL(dx, Upload(backend(), stream(), x));
  ASSIGN_OR_FAIL(dy, backend().Allocate(0, kN * sizeof(double)));
  ASSIGN_OR_FAIL(const expr::Program heavy,
                 expr::Compile("exp(sin(x) * cos(x)) + sqrt(abs(x))",
                               {{"x", expr::ArrayInput{DType::kFloat64}}}));
  const DeviceMemory* inputs[] = {&dx};
  // A first run outside the timed range, so that any compilation is not in it.
  ASSERT_OK(backend().Elementwise(stream(), heavy, inputs, dy, DType::kFloat64, kN).status());
  ASSERT_OK(Synchronize(stream()));
  const auto host_start = std::chrono::steady_clock::now();
  std::shared_ptr<Event> e0, e1, e2;
  ASSIGN_OR_FAIL(e0, stream().Record());
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(backend().Elementwise(stream(), heavy, inputs, dy, DType::kFloat64, kN).status());
  }
  ASSIGN_OR_FAIL(e1, stream().Record());
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(backend().Elementwise(stream(), heavy, inputs, dy, DType::kFloat64, kN).status());
  }
  ASSIGN_OR_FAIL(e2, stream().Record());
  ASSERT_OK(Synchronize(stream()));
  const double host_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start).count();
  double t01, t12, t02, t00;
  ASSIGN_OR_FAIL(t01, backend().ElapsedSeconds(*e0, *e1));
  ASSIGN_OR_FAIL(t12, backend().ElapsedSeconds(*e1, *e2));
  ASSIGN_OR_FAIL(t02, backend().ElapsedSeconds(*e0, *e2));
  ASSIGN_OR_FAIL(t00, backend().ElapsedSeconds(*e0, *e0));
  EXPECT_GT(t01, 0.0);  // four passes over 8 MB take time on any device
  EXPECT_GT(t12, 0.0);
  EXPECT_NEAR(t00, 0.0, 1e-6);
  // Intervals add up (to the event timer's resolution, 0.5 us on CUDA) and fit in the
  // host time around them (with slack for two clocks).
  EXPECT_NEAR(t02, t01 + t12, 1e-5);
  EXPECT_LE(t02, host_seconds + 1e-3);
}

// ---------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------

const int64_t kElementwiseSizes[] = {1, 3, 1 << 20, 1000003};

template <typename T>
void CheckAdd(Backend& backend, Stream& stream, int64_t n) {
  if constexpr (std::is_floating_point_v<T>) {
    // A float sum is rounded once from the exact sum, so the relative error stays below
    // one ulp even where x and y nearly cancel.
    CheckBinary<T, T, T>(
        backend, stream, "x + y", UniformVector<T>(n, -1e3, 1e3, 1),
        UniformVector<T>(n, -1e3, 1e3, 2), [](T a, T b) { return static_cast<double>(a) + b; },
        RelTol<T>());
  } else {
    std::vector<T> x = FullRangeVector<T>(n, 1);
    std::vector<T> y = FullRangeVector<T>(n, 2);
    x[0] = std::numeric_limits<T>::max();  // wraps to the minimum
    y[0] = 1;
    CheckBinary<T, T, T>(backend, stream, "x + y", x, y, [](T a, T b) { return WrapAdd(a, b); });
  }
}

TEST_P(BackendConformance, ElementwiseAdd) {
  for (int64_t n : kElementwiseSizes) {
    CheckAdd<float>(backend(), stream(), n);
    CheckAdd<double>(backend(), stream(), n);
    CheckAdd<int32_t>(backend(), stream(), n);
    CheckAdd<int64_t>(backend(), stream(), n);
  }
}

template <typename T>
void CheckAxpy(Backend& backend, Stream& stream, int64_t n) {
  SCOPED_TRACE(absl::StrCat("a*x + y, ", DTypeName(DTypeOf<T>::value), ", n ", n));
  constexpr DType kT = DTypeOf<T>::value;
  // The scalar is weak: it takes the arrays' dtype, so for float32 it is float32(0.3).
  const expr::ScalarInput a = std::is_floating_point_v<T>
                                  ? expr::ScalarInput{DType::kFloat64, 0.3, 0}
                                  : expr::ScalarInput{DType::kInt64, 0, -3};
  ASSIGN_OR_FAIL(
      const expr::Program program,
      expr::Compile("a*x + y",
                    {{"a", a}, {"x", expr::ArrayInput{kT}}, {"y", expr::ArrayInput{kT}}}));
  ASSERT_EQ(program.result_dtype(), kT);
  std::vector<T> x, y;
  if constexpr (std::is_floating_point_v<T>) {
    // Positive terms: no cancellation, so a relative tolerance of a few roundings holds
    // whether or not the backend fuses the multiply-add.
    x = UniformVector<T>(n, 0.5, 2.0, 3);
    y = UniformVector<T>(n, 0.5, 2.0, 4);
  } else {
    x = FullRangeVector<T>(n, 3);
    y = FullRangeVector<T>(n, 4);
  }
  DeviceMemory dx, dy;
  ASSIGN_OR_FAIL(dx, Upload(backend, stream, x));
  ASSIGN_OR_FAIL(dy, Upload(backend, stream, y));
  std::vector<T> got;
  ASSIGN_OR_FAIL(got, RunElementwise<T>(backend, stream, program, {{"x", &dx}, {"y", &dy}}, n));
  if constexpr (std::is_floating_point_v<T>) {
    const double av = static_cast<double>(static_cast<T>(0.3));
    std::vector<double> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[i] = av * x[i] + static_cast<double>(y[i]);
    ExpectAllClose(got, want, RelTol<T>(), kFloat64Abs);
  } else {
    std::vector<T> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[i] = WrapAdd(WrapMul(static_cast<T>(-3), x[i]), y[i]);
    ExpectAllSame(got, want);
  }
}

TEST_P(BackendConformance, ElementwiseAxpyWithScalar) {
  for (int64_t n : kElementwiseSizes) {
    CheckAxpy<float>(backend(), stream(), n);
    CheckAxpy<double>(backend(), stream(), n);
    CheckAxpy<int32_t>(backend(), stream(), n);
    CheckAxpy<int64_t>(backend(), stream(), n);
  }
}

// The service's reference workload.
constexpr char kReferenceWorkload[] = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";

double ReferenceWorkload(double x) {
  return std::sqrt(
      std::fabs(std::exp(-std::sin(x * x)) / (std::sqrt(std::fabs(x)) * std::tanh(x))));
}

template <typename T>
void CheckReferenceWorkload(Backend& backend, Stream& stream, int64_t n) {
  SCOPED_TRACE(absl::StrCat("reference workload, ", DTypeName(DTypeOf<T>::value), ", n ", n));
  ASSIGN_OR_FAIL(const expr::Program program,
                 expr::Compile(kReferenceWorkload, {{"x", expr::ArrayInput{DTypeOf<T>::value}}}));
  ASSERT_EQ(program.result_dtype(), DTypeOf<T>::value);
  std::vector<T> x = UniformVector<T>(n, -8.0, 8.0, 5);
  x[0] = 0;  // 1 / (0 * 0): +inf in every dtype
  if (n > 2) x[1] = -0.5;
  if (n > 2) x[2] = 1e-20f;
  DeviceMemory dx;
  ASSIGN_OR_FAIL(dx, Upload(backend, stream, x));
  std::vector<T> got;
  ASSIGN_OR_FAIL(got, RunElementwise<T>(backend, stream, program, {{"x", &dx}}, n));
  std::vector<double> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) want[i] = ReferenceWorkload(x[i]);
  // float32: x*x rounds with an absolute error up to 64 * 2^-24 = 3.8e-6 for |x| < 8,
  // which sin and exp carry into a relative error of exp(-sin(x*x)) of the same size;
  // the outer sqrt halves it (1.9e-6), and the remaining six float32 operations add a
  // few ulp each (math libraries, CUDA's included, document 1-2 ulp). 1e-5 bounds that
  // with margin. float64 stays far below 1e-12 by the same argument.
  const double rtol = std::is_same_v<T, float> ? 1e-5 : kFloat64Rel;
  ExpectAllClose(got, want, rtol, kFloat64Abs);
}

TEST_P(BackendConformance, ElementwiseReferenceWorkload) {
  for (int64_t n : kElementwiseSizes) {
    CheckReferenceWorkload<float>(backend(), stream(), n);
    CheckReferenceWorkload<double>(backend(), stream(), n);
  }
}

TEST_P(BackendConformance, ElementwiseMixedDTypes) {
  constexpr int64_t kN = 1001;
  Backend& b = backend();
  Stream& s = stream();
  const auto i32 = IntVector<int32_t>(kN, -2000000000, 2000000000, 11);
  const auto i64 = IntVector<int64_t>(kN, -(int64_t{1} << 40), int64_t{1} << 40, 12);
  const auto i64_full = FullRangeVector<int64_t>(kN, 13);
  const auto f32 = UniformVector<float>(kN, -1e3, 1e3, 14);
  const auto f64 = UniformVector<double>(kN, -1e3, 1e3, 15);
  const auto f32_positive = UniformVector<float>(kN, 0.5, 2, 18);
  auto nonzero = IntVector<int32_t>(kN, 1, 1000, 16);
  for (size_t i = 0; i < nonzero.size(); i += 2) nonzero[i] = -nonzero[i];
  auto flags = IntVector<uint8_t>(kN, 0, 1, 17);
  auto big = i32;
  big[0] = std::numeric_limits<int32_t>::max();
  flags[0] = 1;  // max + true wraps to min

  // NumPy promotion: int32 + float32 and int64 + float32 are float64, exactly the sum of
  // the two values rounded once.
  CheckBinary<double, int32_t, float>(
      b, s, "x + y", i32, f32, [](int32_t x, float y) { return static_cast<double>(x) + y; },
      kFloat64Rel);
  CheckBinary<double, int64_t, float>(
      b, s, "x + y", i64, f32, [](int64_t x, float y) { return static_cast<double>(x) + y; },
      kFloat64Rel);
  CheckBinary<double, float, double>(
      b, s, "x + y", f32, f64, [](float x, double y) { return double{x} + y; }, kFloat64Rel);
  CheckBinary<int64_t, int32_t, int64_t>(
      b, s, "x + y", i32, i64_full, [](int32_t x, int64_t y) { return WrapAdd<int64_t>(x, y); });
  CheckBinary<int32_t, bool, int32_t>(b, s, "x + y", flags, big,
                                      [](uint8_t x, int32_t y) { return WrapAdd<int32_t>(x, y); });
  // True division of integers is float64.
  CheckBinary<double, int32_t, int32_t>(
      b, s, "x / y", i32, nonzero, [](int32_t x, int32_t y) { return static_cast<double>(x) / y; },
      kFloat64Rel);
  // A weak float scalar with an int32 array is float64; a weak int with float32 stays
  // float32; a weak int with int32 stays int32.
  CheckBinary<double, int32_t, int32_t>(
      b, s, "x * 0.5 + 0 * y", i32, nonzero,
      [](int32_t x, int32_t) { return static_cast<double>(x) * 0.5; }, kFloat64Rel);
  // Positive terms, so that 3x + y does not cancel and a relative tolerance holds.
  CheckBinary<float, float, float>(
      b, s, "x * 3 + y", f32_positive, f32_positive, [](float x, float y) { return 3.0 * x + y; },
      kFloat32Rel);
  CheckBinary<int32_t, int32_t, int32_t>(b, s, "x + 1 + 0 * y", big, i32,
                                         [](int32_t x, int32_t) { return WrapAdd<int32_t>(x, 1); });
}

TEST_P(BackendConformance, ElementwiseComparisonsAndWhere) {
  constexpr int64_t kN = 1003;
  Backend& b = backend();
  Stream& s = stream();
  // Small value sets so that equal pairs are common; NaNs sprinkled in the floats.
  auto fx = IntVector<int32_t>(kN, -3, 3, 21);
  auto fy = IntVector<int32_t>(kN, -3, 3, 22);
  std::vector<float> x32(fx.begin(), fx.end()), y32(fy.begin(), fy.end());
  std::vector<double> x64(fx.begin(), fx.end()), y64(fy.begin(), fy.end());
  for (int64_t i = 0; i < kN; i += 17) {
    x32[i] = std::numeric_limits<float>::quiet_NaN();
    x64[i] = kNan;
  }
  for (int64_t i = 5; i < kN; i += 23) {
    y32[i] = std::numeric_limits<float>::quiet_NaN();
    y64[i] = kNan;
  }
  const auto flags = IntVector<uint8_t>(kN, 0, 1, 23);
  const auto l64 = FullRangeVector<int64_t>(kN, 24);

  CheckBinary<bool, float, float>(b, s, "x > y", x32, y32, [](float x, float y) { return x > y; });
  CheckBinary<bool, float, float>(b, s, "x <= y", x32, y32,
                                  [](float x, float y) { return x <= y; });
  CheckBinary<bool, double, double>(b, s, "x != y", x64, y64,
                                    [](double x, double y) { return x != y; });
  CheckBinary<bool, double, double>(b, s, "x == y", x64, y64,
                                    [](double x, double y) { return x == y; });
  CheckBinary<bool, int32_t, int32_t>(b, s, "x < y", fx, fy,
                                      [](int32_t x, int32_t y) { return x < y; });
  CheckBinary<bool, int32_t, int32_t>(b, s, "x >= y", fx, fy,
                                      [](int32_t x, int32_t y) { return x >= y; });
  CheckBinary<bool, double, double>(b, s, "(x <= 0.5) == (y > 1)", x64, y64,
                                    [](double x, double y) { return (x <= 0.5) == (y > 1); });
  // where: bool conditions, and a non-bool condition meaning != 0.
  CheckBinary<float, float, float>(b, s, "where(x > y, x, y)", x32, y32, [](float x, float y) {
    return static_cast<double>(x > y ? x : y);
  });
  CheckBinary<int64_t, bool, int64_t>(
      b, s, "where(x, y, -y)", flags, l64, [](uint8_t x, int64_t y) {
        return x != 0 ? y : static_cast<int64_t>(0 - static_cast<uint64_t>(y));
      });
  CheckBinary<int32_t, int32_t, int32_t>(b, s, "where(x, y, 7)", fx, fy,
                                         [](int32_t x, int32_t y) { return x != 0 ? y : 7; });
  // min and max propagate NaN (np.minimum, np.maximum).
  CheckBinary<double, double, double>(b, s, "min(x, y)", x64, y64, [](double x, double y) {
    return std::isnan(x) || std::isnan(y) ? kNan : std::min(x, y);
  });
  CheckBinary<float, float, float>(b, s, "max(x, y)", x32, y32, [](float x, float y) {
    return std::isnan(x) || std::isnan(y) ? kNan : static_cast<double>(std::max(x, y));
  });
}

// Runs `text` over x and y into an output of dtype Out (wider than the result dtype R,
// same kind) and expects exactly convert(ref(x, y)).
template <typename Out, typename X, typename Y, typename Ref>
void CheckWiderOutput(Backend& backend, Stream& stream, absl::string_view text, DType result,
                      const std::vector<Stored<X>>& x, const std::vector<Stored<Y>>& y, Ref ref) {
  SCOPED_TRACE(absl::StrCat(text, " into ", DTypeName(DTypeOf<Out>::value)));
  ASSIGN_OR_FAIL(const expr::Program program,
                 expr::Compile(std::string_view(text.data(), text.size()),
                               {{"x", expr::ArrayInput{DTypeOf<X>::value}},
                                {"y", expr::ArrayInput{DTypeOf<Y>::value}}}));
  ASSERT_EQ(program.result_dtype(), result);
  ASSERT_TRUE(expr::CanCastSameKind(result, DTypeOf<Out>::value));
  DeviceMemory dx, dy;
  ASSIGN_OR_FAIL(dx, Upload(backend, stream, x));
  ASSIGN_OR_FAIL(dy, Upload(backend, stream, y));
  std::vector<Out> got;
  ASSIGN_OR_FAIL(got, RunElementwise<Out>(backend, stream, program, {{"x", &dx}, {"y", &dy}},
                                          static_cast<int64_t>(x.size())));
  std::vector<Out> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<Out>(ref(x[i], y[i]));
  ExpectAllSame(got, want);
}

TEST_P(BackendConformance, ElementwiseWritesWiderOutput) {
  // The expression is evaluated in its own result dtype and then converted, as NumPy's
  // np.add(x, y, out=wider) does: an int32 sum wraps in int32 before widening, and a
  // float32 sum is rounded to float32 (x + y rounded to float64 and then to float32 is the
  // correctly rounded float32 sum, since 53 >= 2 * 24 + 2).
  constexpr int64_t kN = 1000003;
  Backend& b = backend();
  Stream& s = stream();
  const auto i32a = FullRangeVector<int32_t>(kN, 31);
  const auto i32b = FullRangeVector<int32_t>(kN, 32);
  const auto f32a = UniformVector<float>(kN, -1, 1, 33);
  const auto f32b = UniformVector<float>(kN, -1e-3, 1e-3, 34);
  CheckWiderOutput<int64_t, int32_t, int32_t>(b, s, "x + y", DType::kInt32, i32a, i32b,
                                              [](int32_t x, int32_t y) { return WrapAdd(x, y); });
  CheckWiderOutput<double, int32_t, int32_t>(b, s, "x * y", DType::kInt32, i32a, i32b,
                                             [](int32_t x, int32_t y) { return WrapMul(x, y); });
  CheckWiderOutput<double, float, float>(
      b, s, "x + y", DType::kFloat32, f32a, f32b,
      [](float x, float y) { return static_cast<float>(double{x} + y); });
  CheckWiderOutput<int32_t, float, float>(b, s, "x > y", DType::kBool, f32a, f32b,
                                          [](float x, float y) { return x > y; });
  CheckWiderOutput<double, float, float>(b, s, "x < y", DType::kBool, f32a, f32b,
                                         [](float x, float y) { return x < y; });
}

TEST_P(BackendConformance, ElementwiseOutputMayAliasAnInput) {
  constexpr int64_t kN = 1000003;
  const auto x = UniformVector<double>(kN, -1, 1, 41);
  const auto y = UniformVector<double>(kN, -1, 1, 42);
  const auto xi = FullRangeVector<int32_t>(kN, 43);
  const auto yi = FullRangeVector<int32_t>(kN, 44);
  DeviceMemory dx, dy, dxi, dyi;
  ASSIGN_OR_FAIL(dx, Upload(backend(), stream(), x));
  ASSIGN_OR_FAIL(dy, Upload(backend(), stream(), y));
  ASSIGN_OR_FAIL(dxi, Upload(backend(), stream(), xi));
  ASSIGN_OR_FAIL(dyi, Upload(backend(), stream(), yi));
  const expr::InputMap f64 = {{"x", expr::ArrayInput{DType::kFloat64}},
                              {"y", expr::ArrayInput{DType::kFloat64}}};
  ASSIGN_OR_FAIL(const expr::Program in_place,
                 expr::Compile("x * 3 + 1", {{"x", expr::ArrayInput{DType::kFloat64}}}));
  // Reads both inputs, several times, after the output aliasing x is written.
  ASSIGN_OR_FAIL(const expr::Program both, expr::Compile("where(x > y, y - x, x * y) + x", f64));
  ASSIGN_OR_FAIL(const expr::Program ints,
                 expr::Compile("x * y", {{"x", expr::ArrayInput{DType::kInt32}},
                                         {"y", expr::ArrayInput{DType::kInt32}}}));
  const DeviceMemory* in_x[] = {&dx};
  ASSERT_OK(backend().Elementwise(stream(), in_place, in_x, dx, DType::kFloat64, kN).status());
  std::vector<double> got;
  ASSIGN_OR_FAIL(got, Download<double>(backend(), stream(), dx, kN));
  std::vector<double> want(kN);
  for (int64_t i = 0; i < kN; ++i) want[i] = x[i] * 3 + 1;
  ExpectAllClose(got, want, kFloat64Rel, kFloat64Abs);

  // Now x holds x*3 + 1; write where(...) + x over it.
  const std::vector<double> x1 = got;
  const DeviceMemory* in_xy[] = {&dx, &dy};
  ASSERT_OK(backend().Elementwise(stream(), both, in_xy, dx, DType::kFloat64, kN).status());
  ASSIGN_OR_FAIL(got, Download<double>(backend(), stream(), dx, kN));
  for (int64_t i = 0; i < kN; ++i) {
    want[i] = (x1[i] > y[i] ? y[i] - x1[i] : x1[i] * y[i]) + x1[i];
  }
  ExpectAllClose(got, want, kFloat64Rel, kFloat64Abs);

  // Output aliasing the second input.
  const DeviceMemory* in_ints[] = {&dxi, &dyi};
  ASSERT_OK(backend().Elementwise(stream(), ints, in_ints, dyi, DType::kInt32, kN).status());
  std::vector<int32_t> got_i;
  ASSIGN_OR_FAIL(got_i, Download<int32_t>(backend(), stream(), dyi, kN));
  std::vector<int32_t> want_i(kN);
  for (int64_t i = 0; i < kN; ++i) want_i[i] = WrapMul(xi[i], yi[i]);
  ExpectAllSame(got_i, want_i);
}

TEST_P(BackendConformance, ElementwiseScalarInputsAndEmptyRanges) {
  constexpr int64_t kN = 1001;
  // Only scalars: a is passed as a null DeviceMemory and broadcast.
  ASSIGN_OR_FAIL(const expr::Program scalar,
                 expr::Compile("a * 2 - b", {{"a", expr::ScalarInput{DType::kFloat64, 1.25, 0}},
                                             {"b", expr::ScalarInput{DType::kInt64, 0, 3}}}));
  std::vector<double> got;
  ASSIGN_OR_FAIL(got, RunElementwise<double>(backend(), stream(), scalar, {}, kN));
  ExpectAllSame(got, std::vector<double>(kN, -0.5));
  // A scalar sorted between two arrays: inputs are (a: array, k: scalar, z: array).
  ASSIGN_OR_FAIL(const expr::Program mixed,
                 expr::Compile("a - k * z", {{"a", expr::ArrayInput{DType::kInt64}},
                                             {"k", expr::ScalarInput{DType::kInt32, 0, 5}},
                                             {"z", expr::ArrayInput{DType::kInt64}}}));
  const auto a = IntVector<int64_t>(kN, -1000000, 1000000, 51);
  const auto z = IntVector<int64_t>(kN, -1000000, 1000000, 52);
  DeviceMemory da, dz;
  ASSIGN_OR_FAIL(da, Upload(backend(), stream(), a));
  ASSIGN_OR_FAIL(dz, Upload(backend(), stream(), z));
  std::vector<int64_t> got_i;
  ASSIGN_OR_FAIL(got_i,
                 RunElementwise<int64_t>(backend(), stream(), mixed, {{"a", &da}, {"z", &dz}}, kN));
  std::vector<int64_t> want_i(kN);
  for (int64_t i = 0; i < kN; ++i) want_i[i] = a[i] - 5 * z[i];
  ExpectAllSame(got_i, want_i);
  // n = 0 writes nothing (RunElementwise checks the guard).
  ASSIGN_OR_FAIL(got_i,
                 RunElementwise<int64_t>(backend(), stream(), mixed, {{"a", &da}, {"z", &dz}}, 0));
  EXPECT_TRUE(got_i.empty());
}

TEST_P(BackendConformance, ElementwiseProgramNeedNotOutliveTheCall) {
  // Only memory must stay valid until the work completes; the Program is passed by
  // reference and may be destroyed as soon as Elementwise returns.
  constexpr int64_t kN = 1 << 20;
  const auto x = UniformVector<double>(kN, -1, 1, 61);
  DeviceMemory dx, dy;
  ASSIGN_OR_FAIL(dx, Upload(backend(), stream(), x));
  ASSIGN_OR_FAIL(dy, backend().Allocate(0, kN * sizeof(double)));
  {
    ASSIGN_OR_FAIL(const expr::Program program,
                   expr::Compile("x * x - 2", {{"x", expr::ArrayInput{DType::kFloat64}}}));
    const DeviceMemory* inputs[] = {&dx};
    ASSERT_OK(backend().Elementwise(stream(), program, inputs, dy, DType::kFloat64, kN).status());
  }
  std::vector<double> got;
  ASSIGN_OR_FAIL(got, Download<double>(backend(), stream(), dy, kN));
  std::vector<double> want(kN);
  for (int64_t i = 0; i < kN; ++i) want[i] = x[i] * x[i] - 2;
  ExpectAllClose(got, want, kFloat64Rel, kFloat64Abs);
}

// ---------------------------------------------------------------------------------
// Reduce
// ---------------------------------------------------------------------------------

bool IsArg(ReduceKind kind) { return kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax; }

// One expected output: a float within `tol` of `value` (NaN matches NaN), or an exact
// integer (min and max of floats are exact too: tol 0).
struct Expected {
  bool is_float = false;
  double value = 0;
  double tol = 0;
  int64_t exact = 0;
};

template <typename T>
bool IsNanValue(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(x);
  } else {
    return false;
  }
}

// The reduction of the `count` elements base[0], base[stride], ... (in that order) per
// the semantics in server/cpu/kernels.h and the result dtypes in kernels/ops.h.
template <typename T>
Expected ReduceReference(ReduceKind kind, const Stored<T>* base, int64_t count, int64_t stride) {
  constexpr DType kIn = DTypeOf<T>::value;
  const DType out = ReduceResultDType(kind, kIn);
  // Relative to the magnitude of the terms: float32 input 1e-6, float64 (and integer
  // inputs reduced in float64) 1e-12. For 2^20 float32 terms 1e-6 needs better than a
  // sequential float32 sum (whose error grows like sqrt(n) u = 6e-5): accumulating in
  // float64, as the CPU backend does, or a pairwise / tree sum (log2(n) u = 1.2e-6 at
  // worst, about 1e-7 in practice) passes.
  const double rtol = kIn == DType::kFloat32 ? 1e-6 : kFloat64Rel;
  Expected e;
  e.is_float = IsFloat(out);
  auto at = [&](int64_t r) { return base[r * stride]; };
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kMean: {
      double sum = 0, sum_abs = 0;
      uint64_t wrapped = 0;
      for (int64_t r = 0; r < count; ++r) {
        const double v = static_cast<double>(at(r));
        sum += v;
        sum_abs += std::fabs(v);
        if constexpr (!std::is_floating_point_v<T>) {
          wrapped += static_cast<uint64_t>(static_cast<int64_t>(at(r)));
        }
      }
      // A summation's error bound is relative to the sum of magnitudes, which keeps the
      // check meaningful when positive and negative terms cancel.
      if (kind == ReduceKind::kSum) {
        e.value = sum;
        e.tol = rtol * sum_abs;
        e.exact = static_cast<int64_t>(wrapped);
      } else {
        e.value = sum / static_cast<double>(count);
        e.tol = rtol * sum_abs / static_cast<double>(count);
      }
      break;
    }
    case ReduceKind::kProd: {
      double prod = 1;
      uint64_t wrapped = 1;
      for (int64_t r = 0; r < count; ++r) {
        prod *= static_cast<double>(at(r));
        if constexpr (!std::is_floating_point_v<T>) {
          wrapped *= static_cast<uint64_t>(static_cast<int64_t>(at(r)));
        }
      }
      e.value = prod;
      e.exact = static_cast<int64_t>(wrapped);
      // Floats multiply in the input's precision (kernels/reduce_ops.h). In float64 the
      // count roundings of relative size u add up like a random walk, about sqrt(count) u,
      // and 8 sqrt(count) u stays at 1e-12. Float32 products may drift further (in an order
      // of short partial products near 1 the roundings tend one way), so they get the
      // worst case, gamma = k u / (1 - k u) with k = count - 1: 6e-5 for 1001 factors,
      // 0.067 for 2^20.
      if (kIn == DType::kFloat32) {
        const double k = static_cast<double>(count - 1) * 0x1.0p-24;
        e.tol = std::fabs(prod) * std::max(rtol, k / (1 - k));
      } else {
        e.tol =
            std::fabs(prod) * std::max(rtol, 8 * std::sqrt(static_cast<double>(count)) * 0x1.0p-53);
      }
      break;
    }
    case ReduceKind::kNorm2: {
      double sum = 0;
      for (int64_t r = 0; r < count; ++r) {
        const double v = static_cast<double>(at(r));
        sum += v * v;
      }
      e.value = std::sqrt(sum);
      e.tol = rtol * e.value;
      break;
    }
    case ReduceKind::kMin:
    case ReduceKind::kMax:
    case ReduceKind::kArgmin:
    case ReduceKind::kArgmax: {
      const bool is_max = kind == ReduceKind::kMax || kind == ReduceKind::kArgmax;
      int64_t best = 0;
      for (int64_t r = 0; r < count; ++r) {
        if (IsNanValue(at(r))) {  // the first NaN wins
          best = r;
          break;
        }
        if (is_max ? at(r) > at(best) : at(r) < at(best)) best = r;
      }
      if (IsArg(kind)) {
        e.exact = best;
      } else {
        e.value = static_cast<double>(at(best));
        if constexpr (!std::is_floating_point_v<T>) e.exact = static_cast<int64_t>(at(best));
      }
      break;
    }
    case ReduceKind::kVar:
    case ReduceKind::kStd:
    case ReduceKind::kAny:
    case ReduceKind::kAll:
      // Their references live in reduce_strided_property_test.cc, with ddof and NaN rules.
      ADD_FAILURE() << "ReduceReference has no reference for reduction kind "
                    << static_cast<int>(kind);
      break;
  }
  if (e.is_float && kind != ReduceKind::kMin && kind != ReduceKind::kMax) {
    // Results below the smallest normal number may be flushed to zero (GPUs do so in
    // fast paths) or underflow at a different step.
    e.tol = std::max(e.tol, out == DType::kFloat32 ? double{std::numeric_limits<float>::min()}
                                                   : std::numeric_limits<double>::min());
  }
  return e;
}

// A 2-D array of rows x cols in layout C (row-major) or F (column-major); a 1-D array
// is 1 x n in layout C. axis -1 reduces the whole array.
struct ReduceCase {
  int64_t rows;
  int64_t cols;
  bool f_layout;
  int axis;
};

// One output of a case: the strided run of input elements it reduces.
struct OutputRun {
  int64_t base;
  int64_t count;
  int64_t stride;
};

// The ReduceShape for `c`, as kernels/ops.h defines it, and what each output reduces.
ReduceShape ShapeFor(const ReduceCase& c, std::vector<OutputRun>* runs) {
  const int64_t m = c.rows, n = c.cols;
  runs->clear();
  if (c.axis < 0) {
    runs->push_back({0, m * n, 1});
    return ReduceShape{1, m * n, 1, c.f_layout ? m : 0};
  }
  if (c.axis == 0) {  // out[j] = reduce_i a(i, j)
    for (int64_t j = 0; j < n; ++j) {
      runs->push_back(c.f_layout ? OutputRun{j * m, m, 1} : OutputRun{j, m, n});
    }
    return c.f_layout ? ReduceShape{n, m, 1} : ReduceShape{1, m, n};
  }
  for (int64_t i = 0; i < m; ++i) {  // out[i] = reduce_j a(i, j)
    runs->push_back(c.f_layout ? OutputRun{i, n, m} : OutputRun{i * n, n, 1});
  }
  return c.f_layout ? ReduceShape{1, n, m} : ReduceShape{m, n, 1};
}

std::string CaseName(const ReduceCase& c) {
  return absl::StrCat(c.rows, "x", c.cols, c.f_layout ? " F" : " C",
                      c.axis < 0 ? " whole" : absl::StrCat(" axis ", c.axis));
}

template <typename T>
void CheckReduce(Backend& backend, Stream& stream, ReduceKind kind, const ReduceCase& c,
                 const DeviceMemory& in, const std::vector<Stored<T>>& host) {
  constexpr DType kIn = DTypeOf<T>::value;
  const DType out_dtype = ReduceResultDType(kind, kIn);
  SCOPED_TRACE(absl::StrCat(ReduceKindName(kind), " of ", DTypeName(kIn), " ", CaseName(c)));
  std::vector<OutputRun> runs;
  const ReduceShape shape = ShapeFor(c, &runs);
  const size_t outputs = runs.size();
  const size_t width = DTypeSize(out_dtype);
  const std::vector<uint8_t> guard((outputs + kGuardElements) * width, 0xA5);
  DeviceMemory out;
  ASSIGN_OR_FAIL(out, Upload(backend, stream, guard));
  ASSERT_OK(backend.Reduce(stream, kind, kIn, in, shape, out));
  std::vector<uint8_t> got;
  ASSIGN_OR_FAIL(got, Download<uint8_t>(backend, stream, out, guard.size()));
  ASSERT_TRUE(std::equal(got.begin() + outputs * width, got.end(), guard.begin()))
      << "Reduce wrote past its " << outputs << " outputs";
  int bad = 0;
  for (size_t o = 0; o < outputs && bad < 5; ++o) {
    const OutputRun& run = runs[o];
    Expected e = ReduceReference<T>(kind, host.data() + run.base, run.count, run.stride);
    if (IsArg(kind) && c.axis < 0 && c.f_layout) {
      // ops.h: NumPy's answer, the first extreme in C order; walk the F array row by row.
      std::vector<Stored<T>> c_order(host.size());
      for (int64_t i = 0; i < c.rows; ++i) {
        for (int64_t j = 0; j < c.cols; ++j) c_order[i * c.cols + j] = host[j * c.rows + i];
      }
      e = ReduceReference<T>(kind, c_order.data(), run.count, 1);
    }
    if (e.is_float) {
      const double g = ElementAsDouble(got, out_dtype, o);
      const bool ok = std::isnan(e.value)   ? std::isnan(g)
                      : std::isinf(e.value) ? g == e.value
                                            : std::fabs(g - e.value) <= e.tol;
      if (!ok) {
        ++bad;
        ADD_FAILURE() << "output " << o << ": got " << g << ", want " << e.value << " +- " << e.tol;
      }
    } else {
      const int64_t g = ElementAsInt(got, out_dtype, o);
      if (g != e.exact) {
        ++bad;
        ADD_FAILURE() << "output " << o << ": got " << g << ", want " << e.exact;
      }
    }
  }
}

// Data for reductions: for products values near 1 (floats) or in {-1, 1, 2, 3}
// (integers, so that they wrap); otherwise floats in [-0.5, 1) (mixed signs, but a mean
// of 0.25 keeps |sum| within a factor 2 of the sum of magnitudes, so the tolerance is
// effectively relative to the sum itself), int32 in [-1000, 1000] (many ties, so
// argmin/argmax must pick the first), int64 over the full range (sums wrap), bools half
// true.
template <typename T>
std::vector<Stored<T>> ReduceData(int64_t n, bool for_prod, uint64_t seed) {
  Rng rng(seed);
  std::vector<Stored<T>> v(static_cast<size_t>(n));
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, bool>) {
      x = for_prod ? rng.Uniform(0, 1) < 0.9999 : rng.Uniform(0, 1) < 0.5;
    } else if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(for_prod ? rng.Uniform(0.999, 1.001) : rng.Uniform(-0.5, 1));
    } else if (for_prod) {
      constexpr T kFactors[] = {-1, 1, 1, 2, 3};
      x = kFactors[rng.Next() % 5];
    } else if constexpr (std::is_same_v<T, int32_t>) {
      x = static_cast<T>(rng.Int(-1000, 1000));
    } else {
      x = static_cast<T>(rng.Next());
    }
  }
  return v;
}

// Every kind over every case of one array shape, the input uploaded once per dataset.
template <typename T>
void CheckReduceShapes(Backend& backend, Stream& stream, int64_t rows, int64_t cols,
                       bool with_nans) {
  std::vector<ReduceCase> cases;
  if (rows == 1) {
    cases.push_back({1, cols, false, -1});
  } else {
    for (bool f : {false, true}) {
      for (int axis : {-1, 0, 1}) cases.push_back({rows, cols, f, axis});
    }
  }
  for (bool for_prod : {false, true}) {
    if (with_nans && for_prod) continue;
    std::vector<Stored<T>> host = ReduceData<T>(rows * cols, for_prod, rows * 7919 + cols);
    if constexpr (std::is_floating_point_v<T>) {
      if (with_nans) {
        // A NaN in the middle and a sparse scatter: some outputs see NaNs, most do not.
        host[host.size() / 2] = std::numeric_limits<T>::quiet_NaN();
        for (size_t i = 7918; i < host.size(); i += 7919) {
          host[i] = std::numeric_limits<T>::quiet_NaN();
        }
      }
    }
    DeviceMemory in;
    ASSIGN_OR_FAIL(in, Upload(backend, stream, host));
    for (ReduceKind kind : kShapeReduceKinds) {
      if ((kind == ReduceKind::kProd) != for_prod && !with_nans) continue;
      for (const ReduceCase& c : cases) {
        CheckReduce<T>(backend, stream, kind, c, in, host);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

template <typename T>
void CheckReduceAllShapes(Backend& backend, Stream& stream) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{1} << 20}) {
    CheckReduceShapes<T>(backend, stream, 1, n, false);
  }
  // Long axes with few outputs (50000 x 3, 30001 x 8) make a backend combine partial
  // results of one output; 1024 x 1024 is large both ways.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 1001},
                            {1001, 37},
                            {7, 1},
                            {2, 3},
                            {50000, 3},
                            {30001, 8},
                            {1024, 1024}}) {
    CheckReduceShapes<T>(backend, stream, rows, cols, false);
  }
}

TEST_P(BackendConformance, ReduceFloat32) { CheckReduceAllShapes<float>(backend(), stream()); }
TEST_P(BackendConformance, ReduceFloat64) { CheckReduceAllShapes<double>(backend(), stream()); }
TEST_P(BackendConformance, ReduceInt32) { CheckReduceAllShapes<int32_t>(backend(), stream()); }
TEST_P(BackendConformance, ReduceInt64) { CheckReduceAllShapes<int64_t>(backend(), stream()); }
TEST_P(BackendConformance, ReduceBool) { CheckReduceAllShapes<bool>(backend(), stream()); }

TEST_P(BackendConformance, ReducePropagatesNaN) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {1, 3},
                            {1, 1 << 20},
                            {37, 1001},
                            {1001, 37},
                            {1024, 1024}}) {
    CheckReduceShapes<float>(backend(), stream(), rows, cols, true);
    CheckReduceShapes<double>(backend(), stream(), rows, cols, true);
  }
}

// With distinct values the whole-array argmin/argmax of an F array is NumPy's: the
// C-order index of the extreme, found here by walking the array in C order.
template <typename T>
void CheckArgOfFArray(Backend& backend, Stream& stream, int64_t rows, int64_t cols, bool nan) {
  SCOPED_TRACE(absl::StrCat("F ", rows, "x", cols, " ", DTypeName(DTypeOf<T>::value),
                            nan ? " with a NaN" : ""));
  const int64_t n = rows * cols;
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), -n / 2);
  Rng rng(static_cast<uint64_t>(n));
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.Next() % (i + 1)]);
  std::vector<T> f_data(static_cast<size_t>(n));  // memory order: (i, j) at j * rows + i
  // Quarters for floats, so that not every value is an integer.
  for (int64_t p = 0; p < n; ++p) {
    f_data[p] = std::is_floating_point_v<T> ? static_cast<T>(static_cast<double>(perm[p]) / 4)
                                            : static_cast<T>(perm[p]);
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (nan) f_data[n / 3] = std::numeric_limits<T>::quiet_NaN();
  }
  DeviceMemory in;
  ASSIGN_OR_FAIL(in, Upload(backend, stream, f_data));
  for (ReduceKind kind : {ReduceKind::kArgmin, ReduceKind::kArgmax}) {
    int64_t want = 0;
    T best = f_data[0];
    bool found_nan = false;
    for (int64_t i = 0; i < rows && !found_nan; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const T v = f_data[j * rows + i];
        if (IsNanValue(v)) {
          want = i * cols + j;
          found_nan = true;
          break;
        }
        if ((i == 0 && j == 0) || (kind == ReduceKind::kArgmin ? v < best : v > best)) {
          best = v;
          want = i * cols + j;
        }
      }
    }
    DeviceMemory out;
    ASSIGN_OR_FAIL(out, backend.Allocate(0, sizeof(int64_t)));
    ASSERT_OK(backend.Reduce(stream, kind, DTypeOf<T>::value, in, ReduceShape{1, n, 1, rows}, out));
    std::vector<int64_t> got;
    ASSIGN_OR_FAIL(got, Download<int64_t>(backend, stream, out, 1));
    EXPECT_EQ(got[0], want) << ReduceKindName(kind);
  }
}

// With ties NumPy's answer is the first extreme in C order, which for an F array need
// not be the first in memory: [[1, 0], [0, 1]] is stored {1, 0, 0, 1}, and np.argmin
// gives 1 (row 0, column 1), not 2 (the C index of memory position 1).
TEST_P(BackendConformance, ReduceArgOfFArrayBreaksTiesInCOrder) {
  DeviceMemory in;
  ASSIGN_OR_FAIL(in, Upload(backend(), stream(), std::vector<double>{1, 0, 0, 1}));
  DeviceMemory out;
  ASSIGN_OR_FAIL(out, backend().Allocate(0, sizeof(int64_t)));
  for (auto [kind, want] :
       {std::pair{ReduceKind::kArgmin, int64_t{1}}, std::pair{ReduceKind::kArgmax, int64_t{0}}}) {
    ASSERT_OK(backend().Reduce(stream(), kind, DType::kFloat64, in, ReduceShape{1, 4, 1, 2}, out));
    std::vector<int64_t> got;
    ASSIGN_OR_FAIL(got, Download<int64_t>(backend(), stream(), out, 1));
    EXPECT_EQ(got[0], want) << ReduceKindName(kind);
  }
}

TEST_P(BackendConformance, ReduceArgOfFArrayReportsCOrderIndex) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 1001}, {1001, 37}, {2, 3}, {1, 5}, {5, 1}}) {
    CheckArgOfFArray<float>(backend(), stream(), rows, cols, false);
    CheckArgOfFArray<float>(backend(), stream(), rows, cols, true);
    CheckArgOfFArray<double>(backend(), stream(), rows, cols, true);
    CheckArgOfFArray<int32_t>(backend(), stream(), rows, cols, false);
    CheckArgOfFArray<int64_t>(backend(), stream(), rows, cols, false);
  }
}

// ---------------------------------------------------------------------------------
// Gemv
// ---------------------------------------------------------------------------------

// A and x read through views (GemvShape's lda, offsets and incx): A's contiguous runs
// `lda_pad` elements further apart than dense after `a_offset` elements, x's elements
// `incx` apart (negative: from the end of its memory). Elements between are NaN, so a
// read of one shows.
struct GemvView {
  int64_t lda_pad = 0;
  int64_t a_offset = 0;
  int64_t incx = 1;
};

template <typename T>
void CheckGemv(Backend& backend, Stream& stream, int64_t rows, int64_t cols, bool col_major,
               bool transpose, double alpha, double beta, const GemvView& view = {}) {
  SCOPED_TRACE(absl::StrCat("gemv ", DTypeName(DTypeOf<T>::value), " ", rows, "x", cols,
                            col_major ? " F" : " C", transpose ? " transposed" : "", " alpha ",
                            alpha, " beta ", beta, " lda pad ", view.lda_pad, " a offset ",
                            view.a_offset, " incx ", view.incx));
  const int64_t y_len = transpose ? cols : rows;
  const int64_t x_len = transpose ? rows : cols;
  const uint64_t seed = static_cast<uint64_t>(rows * 131 + cols);
  const std::vector<T> a = UniformVector<T>(rows * cols, -1, 1, seed);
  const std::vector<T> x = UniformVector<T>(x_len, -1, 1, seed + 1);
  std::vector<T> y0 = UniformVector<T>(y_len, -1, 1, seed + 2);
  // beta == 0 must not read y: NaN there must not reach the result.
  if (beta == 0) std::fill(y0.begin(), y0.end(), std::numeric_limits<T>::quiet_NaN());
  const T guard = GuardValue<T>();
  GemvShape shape{rows, cols, col_major, transpose};
  std::vector<T> a_memory = a, x_memory = x;
  if (view.lda_pad != 0 || view.a_offset != 0 || view.incx != 1) {
    const T nan = std::numeric_limits<T>::quiet_NaN();
    const int64_t run = col_major ? rows : cols;  // a contiguous run of A
    const int64_t runs = col_major ? cols : rows;
    shape.lda = std::max<int64_t>(run, 1) + view.lda_pad;
    shape.a_offset = view.a_offset;
    a_memory.assign(view.a_offset + runs * shape.lda, nan);
    for (int64_t r = 0; r < runs; ++r) {
      std::copy_n(a.begin() + r * run, run, a_memory.begin() + view.a_offset + r * shape.lda);
    }
    const int64_t step = std::abs(view.incx);
    shape.incx = view.incx;
    shape.x_offset = 2 + (view.incx < 0 ? (x_len - 1) * step : 0);
    x_memory.assign(3 + x_len * step, nan);
    for (int64_t k = 0; k < x_len; ++k) x_memory[shape.x_offset + k * view.incx] = x[k];
  }
  DeviceMemory da, dx, dy;
  ASSIGN_OR_FAIL(da, Upload(backend, stream, a_memory));
  ASSIGN_OR_FAIL(dx, Upload(backend, stream, x_memory));
  ASSIGN_OR_FAIL(dy, Upload(backend, stream, y0, kGuardElements, &guard));
  ASSERT_OK(backend.Gemv(stream, DTypeOf<T>::value, shape, alpha, da, dx, beta, dy));
  std::vector<T> got;
  ASSIGN_OR_FAIL(got, Download<T>(backend, stream, dy, y_len + kGuardElements));
  ExpectGuardIntact(std::span<const T>(got).subspan(y_len));
  // A(i, j) as stored; op(A)(p, k) = A(p, k), or A(k, p) when transposed.
  auto at = [&](int64_t i, int64_t j) {
    return double{a[col_major ? j * rows + i : i * cols + j]};
  };
  // float32: a backend may accumulate the x_len products in float32 (as cuBLAS does),
  // whose error grows with the number of terms (about sqrt(x_len) roundings of 6e-8, up
  // to 2e-6 for 1001 terms); 1e-5 of the magnitude of the terms bounds that with margin.
  const double rtol = std::is_same_v<T, float> ? 1e-5 : kFloat64Rel;
  int bad = 0;
  for (int64_t p = 0; p < y_len && bad < 5; ++p) {
    double dot = 0, magnitude = 0;
    for (int64_t k = 0; k < x_len; ++k) {
      const double term = (transpose ? at(k, p) : at(p, k)) * x[k];
      dot += term;
      magnitude += std::fabs(term);
    }
    double want = alpha * dot;
    magnitude = std::fabs(alpha) * magnitude;
    if (beta != 0) {
      want += beta * y0[p];
      magnitude += std::fabs(beta * y0[p]);
    }
    const double g = got[p];
    if (!(std::fabs(g - want) <= rtol * magnitude + kFloat64Abs)) {
      ++bad;
      ADD_FAILURE() << "y[" << p << "]: got " << g << ", want " << want << " +- "
                    << rtol * magnitude;
    }
  }
}

template <typename T>
void CheckGemvAll(Backend& backend, Stream& stream) {
  constexpr std::pair<double, double> kAlphaBeta[] = {{1, 0}, {2.5, -0.5}, {-1, 1}, {0, 2}, {0, 0}};
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 1001}, {1001, 37}, {1, 1}, {1, 5}, {5, 1}, {3, 70001}}) {
    for (bool col_major : {false, true}) {
      for (bool transpose : {false, true}) {
        for (auto [alpha, beta] : kAlphaBeta) {
          CheckGemv<T>(backend, stream, rows, cols, col_major, transpose, alpha, beta);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_P(BackendConformance, GemvFloat32) { CheckGemvAll<float>(backend(), stream()); }
TEST_P(BackendConformance, GemvFloat64) { CheckGemvAll<double>(backend(), stream()); }

// GemvOp through views: a leading dimension longer than dense, an offset into A, x at
// strides positive and negative.
template <typename T>
void CheckGemvViews(Backend& backend, Stream& stream) {
  for (GemvView view : {GemvView{3, 5, 1}, GemvView{0, 0, 2}, GemvView{0, 0, -1},
                        GemvView{7, 1, -3}}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 1001}, {1001, 37}, {1, 5}, {5, 1}}) {
      for (bool col_major : {false, true}) {
        for (bool transpose : {false, true}) {
          for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{2.5, -0.5}}) {
            CheckGemv<T>(backend, stream, rows, cols, col_major, transpose, alpha, beta, view);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST_P(BackendConformance, GemvThroughViewsFloat32) { CheckGemvViews<float>(backend(), stream()); }
TEST_P(BackendConformance, GemvThroughViewsFloat64) {
  CheckGemvViews<double>(backend(), stream());
}

// ---------------------------------------------------------------------------------
// Random
// ---------------------------------------------------------------------------------

// Element i of a fill, computed here from the definition at the top of kernels/philox.h:
// only the Philox block itself (PhiloxBlock, checked against Random123's known answers
// in tests/cpu/philox_test.cc) comes from the header. Normal v2 is defined by the
// header's arithmetic itself (tests/cpu/philox_test.cc holds it to 4 ulp of the exact
// Box-Muller value), so its definition here is the header's RandomElement. Normal v3
// takes lane j from word j through the header's NormalFloat32V3 (tests/cpu/normal_v3_test.cc
// holds it to 2.1 ulp of the exact inverse CDF) in float32, and is v2 in float64.
template <typename T>
T DefinedRandomElement(const RandomParams& p, uint64_t i) {
  constexpr DType kT = DTypeOf<T>::value;
  const bool v3 = p.distribution == Distribution::kNormal &&
                  p.normal_transform == NormalTransform::kInverseCdfV3;
  if constexpr (!std::is_integral_v<T>) {
    if ((p.distribution == Distribution::kNormal &&
         p.normal_transform == NormalTransform::kBoxMullerV2) ||
        (v3 && kT == DType::kFloat64)) {
      RandomParams v2 = p;
      v2.normal_transform = NormalTransform::kBoxMullerV2;
      return RandomElement<T>(v2, i);
    }
  }
  const int k = kT == DType::kFloat32 ? 4 : 2;
  const PhiloxWords b = PhiloxBlock(p.seed, p.offset + i / k);
  const int j = static_cast<int>(i % k);
  auto join = [](uint32_t lo, uint32_t hi) { return (uint64_t{hi} << 32) | lo; };
  if constexpr (std::is_integral_v<T>) {
    const uint64_t x = join(b.w[2 * j], b.w[2 * j + 1]);
    const uint64_t range = static_cast<uint64_t>(p.high) - static_cast<uint64_t>(p.low);
    const uint64_t scaled =
        static_cast<uint64_t>((static_cast<unsigned __int128>(x) * range) >> 64);
    return static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(p.low) + scaled));
  } else if constexpr (kT == DType::kFloat32) {
    if (p.distribution == Distribution::kUniform) {
      return static_cast<float>(b.w[j] >> 8) * 0x1.0p-24f;
    }
    if (v3) {
      return std::fma(static_cast<float>(p.stddev), NormalFloat32V3(b.w[j]),
                      static_cast<float>(p.mean));
    }
    const uint32_t wa = b.w[j < 2 ? 0 : 2];
    const uint32_t wb = b.w[j < 2 ? 1 : 3];
    const float u1 = static_cast<float>((wa >> 8) + 1) * 0x1.0p-24f;
    const float u2 = static_cast<float>(wb >> 8) * 0x1.0p-24f;
    const float r = std::sqrt(-2.0f * std::log(u1));
    const float t = 6.28318530717958647692f * u2;
    const float z = j % 2 == 0 ? r * std::cos(t) : r * std::sin(t);
    return static_cast<float>(p.mean) + static_cast<float>(p.stddev) * z;
  } else {
    if (p.distribution == Distribution::kUniform) {
      return static_cast<double>(join(b.w[2 * j], b.w[2 * j + 1]) >> 11) * 0x1.0p-53;
    }
    const double u1 = static_cast<double>((join(b.w[0], b.w[1]) >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(join(b.w[2], b.w[3]) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 6.28318530717958647692 * u2;
    const double z = j == 0 ? r * std::cos(t) : r * std::sin(t);
    return p.mean + p.stddev * z;
  }
}

// Whether `got` matches the defined value `want` of a fill: bit for bit for integers,
// uniforms and normals v2 and v3 (exact operations only, the same on every backend); for normal
// v1, which goes through log/sqrt/cos/sin whose last bits differ between math libraries,
// within 4 float32 ulp or 1e-12 (float64) of |mean| + |stddev * z|.
template <typename T>
bool RandomMatches(const RandomParams& p, T got, T want) {
  if constexpr (std::is_integral_v<T>) {
    return got == want;
  } else {
    if (p.distribution == Distribution::kUniform ||
        p.normal_transform != NormalTransform::kBoxMullerV1) {
      return SameBits(got, want);
    }
    const double scale = std::fabs(p.mean) + std::fabs(static_cast<double>(want) - p.mean);
    if constexpr (std::is_same_v<T, float>) {
      const float s = static_cast<float>(scale);
      const double ulp =
          static_cast<double>(std::nextafter(s, std::numeric_limits<float>::infinity())) - s;
      return std::fabs(static_cast<double>(got) - want) <= 4 * ulp;
    } else {
      return std::fabs(got - want) <= kFloat64Rel * scale;
    }
  }
}

template <typename T>
void CheckRandom(Backend& backend, Stream& stream, const RandomParams& p, int64_t n) {
  constexpr DType kT = DTypeOf<T>::value;
  SCOPED_TRACE(absl::StrCat(
      "random ", DTypeName(kT), " distribution ", static_cast<int>(p.distribution), " seed ",
      p.seed, " offset ", p.offset, " mean ", p.mean, " stddev ", p.stddev, " normal v",
      static_cast<int>(p.normal_transform), " [", p.low, ", ", p.high, ") n ", n));
  ASSERT_NE(ElementsPerCounter(p.distribution, kT), 0);
  const T guard = GuardValue<T>();
  DeviceMemory out;
  ASSIGN_OR_FAIL(out, Upload<T>(backend, stream, std::span<const T>(),
                                static_cast<size_t>(n) + kGuardElements, &guard));
  ASSERT_OK(backend.Random(stream, p, kT, out, n));
  std::vector<T> got;
  ASSIGN_OR_FAIL(got, Download<T>(backend, stream, out, static_cast<size_t>(n) + kGuardElements));
  ExpectGuardIntact(std::span<const T>(got).subspan(static_cast<size_t>(n)));
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const T want = DefinedRandomElement<T>(p, static_cast<uint64_t>(i));
    if (!RandomMatches(p, got[i], want)) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": got " << +got[i] << ", want " << +want;
    }
    // kernels/philox.h's own per-element function, which a CUDA kernel calls, agrees
    // with the definition.
    if (!RandomMatches(p, RandomElement<T>(p, static_cast<uint64_t>(i)), want)) {
      ++bad;
      ADD_FAILURE() << "RandomElement(" << i << ") disagrees with the definition";
    }
  }
  if constexpr (std::is_integral_v<T>) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(got[i] >= p.low && got[i] < p.high) << "element " << i << " = " << got[i];
    }
  } else if (p.distribution == Distribution::kUniform) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(got[i] >= 0 && got[i] < 1) << "element " << i << " = " << got[i];
    }
  }
}

RandomParams Uniform(uint64_t seed, uint64_t offset) {
  RandomParams p;
  p.distribution = Distribution::kUniform;
  p.seed = seed;
  p.offset = offset;
  return p;
}

RandomParams Normal(uint64_t seed, uint64_t offset, double mean, double stddev) {
  RandomParams p = Uniform(seed, offset);
  p.distribution = Distribution::kNormal;
  p.mean = mean;
  p.stddev = stddev;
  return p;
}

RandomParams NormalV2(uint64_t seed, uint64_t offset, double mean, double stddev) {
  RandomParams p = Normal(seed, offset, mean, stddev);
  p.normal_transform = NormalTransform::kBoxMullerV2;
  return p;
}

RandomParams NormalV3(uint64_t seed, uint64_t offset, double mean, double stddev) {
  RandomParams p = Normal(seed, offset, mean, stddev);
  p.normal_transform = NormalTransform::kInverseCdfV3;
  return p;
}

RandomParams Integers(uint64_t seed, uint64_t offset, int64_t low, int64_t high) {
  RandomParams p = Uniform(seed, offset);
  p.distribution = Distribution::kIntegers;
  p.low = low;
  p.high = high;
  return p;
}

// Seeds with both key words in use, and offsets where the counter's low word carries
// into the high word or the whole counter wraps around 2^64.
constexpr uint64_t kSeeds[] = {0, 42, 0x123456789ABCDEF0ull};
constexpr uint64_t kOffsets[] = {0, 5, 0xFFFFFFFEull, 0xFFFFFFFFFFFFFFFEull};
constexpr int64_t kRandomSizes[] = {1, 3, 5, 4099};

TEST_P(BackendConformance, RandomUniformMatchesPhilox) {
  for (uint64_t seed : kSeeds) {
    for (uint64_t offset : kOffsets) {
      for (int64_t n : kRandomSizes) {
        CheckRandom<float>(backend(), stream(), Uniform(seed, offset), n);
        CheckRandom<double>(backend(), stream(), Uniform(seed, offset), n);
      }
    }
  }
  CheckRandom<float>(backend(), stream(), Uniform(7, 0), 1000003);
  CheckRandom<double>(backend(), stream(), Uniform(7, 0), 1000003);
}

// v1 to a few ulp of the definition, v2 and v3 bit for bit (an agreement bound of 0 ulp
// between backends).
TEST_P(BackendConformance, RandomNormalMatchesPhilox) {
  for (auto normal : {Normal, NormalV2, NormalV3}) {
    for (uint64_t seed : kSeeds) {
      for (uint64_t offset : kOffsets) {
        for (int64_t n : kRandomSizes) {
          CheckRandom<float>(backend(), stream(), normal(seed, offset, 0, 1), n);
          CheckRandom<double>(backend(), stream(), normal(seed, offset, 0, 1), n);
          CheckRandom<float>(backend(), stream(), normal(seed, offset, 3, 0.5), n);
          CheckRandom<double>(backend(), stream(), normal(seed, offset, -1e3, 1e-2), n);
        }
      }
    }
    CheckRandom<float>(backend(), stream(), normal(7, 0, 1, 2), 1000003);
    CheckRandom<double>(backend(), stream(), normal(7, 0, 1, 2), 1000003);
  }
}

TEST_P(BackendConformance, RandomIntegersMatchPhilox) {
  constexpr int64_t kMin32 = std::numeric_limits<int32_t>::min();
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  const std::pair<int64_t, int64_t> ranges32[] = {{0, 10}, {-5, 5}, {-1, 0}, {kMin32, kMax32}};
  const std::pair<int64_t, int64_t> ranges64[] = {
      {0, 2}, {-3, 1000000000000}, {kMin64, kMax64}, {kMax64 - 1, kMax64}};
  for (uint64_t seed : kSeeds) {
    for (uint64_t offset : kOffsets) {
      for (int64_t n : kRandomSizes) {
        for (auto [low, high] : ranges32) {
          CheckRandom<int32_t>(backend(), stream(), Integers(seed, offset, low, high), n);
        }
        for (auto [low, high] : ranges64) {
          CheckRandom<int64_t>(backend(), stream(), Integers(seed, offset, low, high), n);
        }
      }
    }
  }
  CheckRandom<int32_t>(backend(), stream(), Integers(7, 0, -100, 100), 1000003);
  CheckRandom<int64_t>(backend(), stream(), Integers(7, 0, kMin64, kMax64), 1000003);
}

// A fill of n elements at offset o is elements [o*k, o*k + n) of a fill at offset 0.
template <typename T>
void CheckOffsetContinuation(Backend& backend, Stream& stream, RandomParams p) {
  constexpr DType kT = DTypeOf<T>::value;
  SCOPED_TRACE(absl::StrCat("continuation, ", DTypeName(kT), " distribution ",
                            static_cast<int>(p.distribution)));
  const int64_t k = ElementsPerCounter(p.distribution, kT);
  constexpr int64_t kLarge = 4099;
  constexpr int64_t kPart = 1001;
  DeviceMemory large, part;
  ASSIGN_OR_FAIL(large, backend.Allocate(0, kLarge * sizeof(T)));
  ASSIGN_OR_FAIL(part, backend.Allocate(0, kPart * sizeof(T)));
  p.offset = 0;
  ASSERT_OK(backend.Random(stream, p, kT, large, kLarge));
  for (uint64_t o : {uint64_t{0}, uint64_t{1}, uint64_t{17}, uint64_t{700}}) {
    SCOPED_TRACE(absl::StrCat("offset ", o));
    p.offset = o;
    ASSERT_OK(backend.Random(stream, p, kT, part, kPart));
    std::vector<T> got_large, got_part;
    ASSIGN_OR_FAIL(got_large, Download<T>(backend, stream, large, kLarge));
    ASSIGN_OR_FAIL(got_part, Download<T>(backend, stream, part, kPart));
    ASSERT_LE(static_cast<int64_t>(o) * k + kPart, kLarge);
    const int64_t first = static_cast<int64_t>(o) * k;
    ExpectAllSame(got_part,
                  std::vector<T>(got_large.begin() + first, got_large.begin() + first + kPart));
    // The counters consumed are what CountersUsed says, so advancing by it continues.
    EXPECT_EQ(CountersUsed(p.distribution, kT, kPart), static_cast<uint64_t>((kPart + k - 1) / k));
  }
}

TEST_P(BackendConformance, RandomOffsetContinuesAFill) {
  CheckOffsetContinuation<float>(backend(), stream(), Uniform(9, 0));
  CheckOffsetContinuation<double>(backend(), stream(), Uniform(9, 0));
  CheckOffsetContinuation<float>(backend(), stream(), Normal(9, 0, 0, 1));
  CheckOffsetContinuation<double>(backend(), stream(), Normal(9, 0, 0, 1));
  CheckOffsetContinuation<float>(backend(), stream(), NormalV2(9, 0, 0, 1));
  CheckOffsetContinuation<double>(backend(), stream(), NormalV2(9, 0, 0, 1));
  CheckOffsetContinuation<int32_t>(backend(), stream(), Integers(9, 0, -7, 1000));
  CheckOffsetContinuation<int64_t>(backend(), stream(), Integers(9, 0, -7, int64_t{1} << 50));
}

// index(k) through ElementwiseStrided as the planner launches it (layouts not coalesced):
// numpy.arange, linspace, eye, indices and tril of a transposed operand, against the
// values NumPy gives, in float64.
TEST_P(BackendConformance, IndexReadsTheCoordinatesAlongTheResultsAxes) {
  const auto run = [&](const std::string& text, const expr::InputMap& types,
                       std::vector<StridedInput> inputs,
                       const std::vector<uint64_t>& shape) -> absl::StatusOr<std::vector<double>> {
    absl::StatusOr<expr::Program> program = expr::Compile(text, types);
    if (!program.ok()) return program.status();
    const StridedLayout out_layout = DenseLayout(shape, /*fortran_order=*/false);
    const auto n = static_cast<size_t>(out_layout.num_elements());
    absl::StatusOr<DeviceMemory> out = backend().Allocate(0, std::max<size_t>(n, 1) * 8);
    if (!out.ok()) return out.status();
    absl::StatusOr<LaunchInfo> launched =
        backend().ElementwiseStrided(stream(), *program, inputs, *out, out_layout, DType::kFloat64);
    if (!launched.ok()) return launched.status();
    return Download<double>(backend(), stream(), *out, n);
  };
  constexpr int64_t kLong = 100003;  // longer than any kernel's block
  ASSIGN_OR_FAIL(std::vector<double> arange, run("index(0)", {}, {}, {kLong}));
  std::vector<double> ref(kLong);
  std::iota(ref.begin(), ref.end(), 0.0);
  EXPECT_EQ(arange, ref);

  // numpy.linspace(-1.5, 2.25, 11) is start + arange(11) * step, and then stop.
  const expr::InputMap scalars = {{"start", expr::ScalarInput{DType::kFloat64, -1.5}},
                                  {"step", expr::ScalarInput{DType::kFloat64, 0.375}}};
  ASSIGN_OR_FAIL(std::vector<double> linspace,
                 run("start + index(-1) * step", scalars, {{nullptr, {}}, {nullptr, {}}}, {11}));
  ref.clear();
  for (int i = 0; i < 11; ++i) ref.push_back(-1.5 + i * 0.375);
  EXPECT_EQ(linspace, ref);

  ASSIGN_OR_FAIL(std::vector<double> eye,
                 run("where(index(0) == index(1), 1.0, 0.0)", {}, {}, {3, 4}));
  EXPECT_EQ(eye, (std::vector<double>{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}));
  ASSIGN_OR_FAIL(std::vector<double> indices,
                 run("index(0) * 100 + index(1) * 10 + index(-1)", {}, {}, {2, 3, 4}));
  ref.clear();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) ref.push_back(i * 100 + j * 10 + k);
    }
  }
  EXPECT_EQ(indices, ref);

  // numpy.tril(m.T) for m of shape (3, 4): the coordinates are the result's, whatever the
  // operand's strides.
  std::vector<double> m(12);
  std::iota(m.begin(), m.end(), 0.5);
  ASSIGN_OR_FAIL(DeviceMemory bm, Upload(backend(), stream(), m));
  const StridedLayout transposed{.shape = {4, 3}, .strides = {1, 4}, .offset = 0};
  ASSIGN_OR_FAIL(std::vector<double> tril,
                 run("where(index(1) <= index(0), x, 0.0)",
                     {{"x", expr::ArrayInput{DType::kFloat64}}}, {{&bm, transposed}}, {4, 3}));
  ref.clear();
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) ref.push_back(j <= i ? m[j * 4 + i] : 0.0);
  }
  EXPECT_EQ(tril, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, BackendConformance,
    ::testing::Values(
        BackendFactory{"ThreeThreads", [] { return std::make_unique<cpu::CpuBackend>(3); }},
        BackendFactory{"OneThread", [] { return std::make_unique<cpu::CpuBackend>(1); }}),
    BackendFactoryName);

#if defined(GPUCOMPUTE_HAVE_CUDA)
INSTANTIATE_TEST_SUITE_P(Cuda, BackendConformance,
                         ::testing::Values(BackendFactory{"Gpu", MaybeCreateCudaBackend}),
                         BackendFactoryName);
#endif

}  // namespace
}  // namespace gpucompute::conformance
