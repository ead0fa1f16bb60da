// The NVRTC-generated fused elementwise kernels on a GPU, element by element against the
// CPU evaluator (server/cpu/elementwise.h, the reference) on the same inputs: every OpKind
// at every dtype, every output conversion, scalar parameters, literals, sizes with tails,
// misaligned pointers (the scalar kernel), in-place and overlapping outputs, and kernel
// reuse across scalar values. Inputs mix random values with NaN, +-inf, +-0, subnormals,
// integer extremes and non-0/1 bool bytes. Integer, bool, comparison, conversion and IEEE
// arithmetic results must match exactly; math-library functions within a few ulps (the
// CUDA and glibc libraries are different approximations). Every test skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/cpu/elementwise.h"
#include "server/cpu/thread_pool.h"
#include "server/core/backend.h"
#include "server/cuda/cuda_backend.h"
#include "server/cuda/elementwise_kernels.h"
#include "server/expression/expression.h"
#include "tests/support/test_util.h"

namespace gpucompute::cuda {
namespace {

using expr::ArrayInput;
using expr::InputMap;
using expr::Program;
using expr::ScalarInput;

// ---- host data ----

// Bytes of n elements of `dtype`.
struct HostArray {
  DType dtype = DType::kFloat64;
  int64_t n = 0;
  std::vector<uint8_t> bytes;

  HostArray() = default;
  HostArray(DType t, int64_t count)
      : dtype(t), n(count), bytes(static_cast<size_t>(count) * DTypeSize(t)) {}
  template <typename T>
  void Set(int64_t i, T v) {
    std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
  }
  template <typename T>
  T Get(int64_t i) const {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    return v;
  }
  std::string Describe(int64_t i) const {
    switch (dtype) {
      case DType::kBool:
        return absl::StrCat("byte ", bytes[i]);
      case DType::kInt32:
        return absl::StrCat(Get<int32_t>(i));
      case DType::kInt64:
        return absl::StrCat(Get<int64_t>(i));
      case DType::kFloat32:
        return absl::StrFormat("%a (%g)", Get<float>(i), Get<float>(i));
      case DType::kFloat64:
        return absl::StrFormat("%a (%g)", Get<double>(i), Get<double>(i));
    }
    return "?";
  }
};

template <typename T>
std::vector<T> FloatSpecials() {
  using L = std::numeric_limits<T>;
  return {L::quiet_NaN(),
          L::infinity(),
          -L::infinity(),
          T(0),
          -T(0),
          T(1),
          T(-1),
          T(0.5),
          T(-0.5),
          T(2),
          T(3),
          T(-3),
          L::max(),
          L::lowest(),
          L::min(),
          L::denorm_min(),
          -L::denorm_min(),
          T(1e-30),
          T(1e30),
          T(88.7),
          T(-103.5),
          T(710.5),
          T(1e10),
          T(1.5707963267948966),
          T(0.99999),
          T(-0.99999),
          T(100.25),
          T(-7)};
}

template <typename T>
std::vector<T> IntSpecials() {
  using L = std::numeric_limits<T>;
  return {L::min(), L::max(), T(0),     T(1),    T(-1),           T(2),
          T(-2),    T(3),     T(31),    T(32),   T(63),           T(64),
          T(-31),   T(46341), T(65536), T(1000), T(L::min() + 1), T(L::max() - 1)};
}

// The special values of `dtype`, as one array (bool: bytes, including non-0/1 ones).
HostArray Specials(DType dtype) {
  return VisitDType(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      HostArray a(DType::kBool, 6);
      const uint8_t bytes[] = {0, 1, 2, 255, 128, 0};
      std::memcpy(a.bytes.data(), bytes, 6);
      return a;
    } else if constexpr (std::is_floating_point_v<T>) {
      const std::vector<T> v = FloatSpecials<T>();
      HostArray a(dtype, static_cast<int64_t>(v.size()));
      for (size_t i = 0; i < v.size(); ++i) a.Set<T>(static_cast<int64_t>(i), v[i]);
      return a;
    } else {
      const std::vector<T> v = IntSpecials<T>();
      HostArray a(dtype, static_cast<int64_t>(v.size()));
      for (size_t i = 0; i < v.size(); ++i) a.Set<T>(static_cast<int64_t>(i), v[i]);
      return a;
    }
  });
}

// Random values of `dtype`: moderate ones (the domain of asin, small pow exponents), any
// magnitude (log-uniform, both signs), small integers; bool bytes are any byte half the time.
void FillRandom(HostArray& a, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 2);
  VisitDType(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < a.n; ++i) {
      const int k = kind(rng);
      if constexpr (std::is_same_v<T, bool>) {
        a.bytes[i] = (rng() & 1) ? 0 : static_cast<uint8_t>(rng());
      } else if constexpr (std::is_floating_point_v<T>) {
        T v;
        if (k == 0) {
          v = static_cast<T>(std::uniform_real_distribution<double>(-4, 4)(rng));
        } else if (k == 1) {
          const int max_exp = std::numeric_limits<T>::max_exponent;
          const int min_exp = std::numeric_limits<T>::min_exponent - std::numeric_limits<T>::digits;
          const double e = std::uniform_real_distribution<double>(min_exp, max_exp - 1)(rng);
          v = static_cast<T>(
              std::ldexp(std::uniform_real_distribution<double>(0.5, 1)(rng), static_cast<int>(e)));
          if (rng() & 1) v = -v;
        } else {
          v = static_cast<T>(std::uniform_int_distribution<int>(-20, 20)(rng));
        }
        a.Set<T>(i, v);
      } else {
        T v;
        if (k == 0) {
          v = static_cast<T>(rng());
        } else if (k == 1) {
          v = static_cast<T>(std::uniform_int_distribution<int>(-100, 100)(rng));
        } else {
          v = static_cast<T>(std::uniform_int_distribution<int>(-3, 40)(rng));
        }
        a.Set<T>(i, v);
      }
    }
  });
}

// Random arrays for the program's array inputs. The first elements hold every tuple of
// special values across the arrays (as far as half the array allows), so that binary
// operations meet NaN against inf, INT_MIN against -1, and so on; the rest is random.
std::vector<HostArray> MakeInputs(const Program& program, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<HostArray> arrays(program.inputs().size());
  const int64_t region = std::max<int64_t>(n / 2, std::min<int64_t>(n, 64));
  int64_t period = 1;
  for (size_t k = 0; k < arrays.size(); ++k) {
    const auto* array = std::get_if<ArrayInput>(&program.input_types()[k]);
    if (array == nullptr) continue;
    arrays[k] = HostArray(array->dtype, n);
    FillRandom(arrays[k], rng);
    const HostArray specials = Specials(array->dtype);
    const size_t size = DTypeSize(array->dtype);
    for (int64_t i = 0; i < region; ++i) {
      const int64_t s = (i / period) % specials.n;
      std::memcpy(arrays[k].bytes.data() + i * size, specials.bytes.data() + s * size, size);
    }
    period = std::min(period * specials.n, region);
  }
  return arrays;
}

// ---- comparison ----

// Distance in units in the last place, through the ordering of IEEE bit patterns
// (adjacent floats differ by one, -0 == +0, the largest finite value is one from inf).
template <typename T, typename Bits>
__int128 OrderedBits(T v) {
  Bits bits;
  std::memcpy(&bits, &v, sizeof(v));
  constexpr Bits kSign = Bits{1} << (sizeof(Bits) * 8 - 1);
  return (bits & kSign) ? -static_cast<__int128>(bits & ~kSign) : static_cast<__int128>(bits);
}

template <typename T>
__int128 UlpDistance(T a, T b) {
  __int128 d;
  if constexpr (sizeof(T) == 4) {
    d = OrderedBits<T, uint32_t>(a) - OrderedBits<T, uint32_t>(b);
  } else {
    d = OrderedBits<T, uint64_t>(a) - OrderedBits<T, uint64_t>(b);
  }
  return d < 0 ? -d : d;
}

// Expects `got` (GPU) to match `want` (CPU): exactly, or within `ulps` for floats. NaNs
// match any NaN (payloads differ between the two). Reports the first few mismatches with
// their inputs.
void ExpectMatches(const HostArray& got, const HostArray& want, int ulps,
                   const std::vector<HostArray>& inputs, const std::string& what) {
  ASSERT_EQ(got.n, want.n);
  int reported = 0;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < got.n; ++i) {
    bool ok = true;
    std::string got_text;
    std::string want_text;
    VisitDType(got.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        const T g = got.Get<T>(i);
        const T w = want.Get<T>(i);
        if (std::isnan(g) || std::isnan(w)) {
          ok = std::isnan(g) && std::isnan(w);
        } else if (ulps == 0) {
          ok = std::memcmp(&g, &w, sizeof(T)) == 0;  // bitwise: the sign of zero too
        } else {
          ok = UlpDistance(g, w) <= ulps;
        }
      } else {
        ok = std::memcmp(got.bytes.data() + i * sizeof(T), want.bytes.data() + i * sizeof(T),
                         sizeof(T)) == 0;
      }
    });
    if (ok) continue;
    ++mismatches;
    if (reported++ < 8) {
      std::string in;
      for (size_t k = 0; k < inputs.size(); ++k) {
        if (inputs[k].n > i) absl::StrAppend(&in, " in", k, "=", inputs[k].Describe(i));
      }
      ADD_FAILURE() << what << ": element " << i << ": GPU " << got.Describe(i) << ", CPU "
                    << want.Describe(i) << " (tolerance " << ulps << " ulps);" << in;
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

// ---- device plumbing ----

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(bytes, 1)), cudaSuccess);
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) {
      EXPECT_EQ(cudaFree(data_), cudaSuccess);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
};

struct RunOptions {
  bool misalign_inputs = false;  // every array input one element off 16-byte alignment
  bool misalign_out = false;
  int in_place = -1;  // write the output over this input's buffer
  uint64_t seed = 1;
};

ElementwiseKernels& Kernels() {
  // Shared by all tests so that repeated expressions compile once; never destroyed, so
  // that no CUDA call runs during static destruction.
  static ElementwiseKernels* kernels = new ElementwiseKernels("");
  return *kernels;
}

class CudaElementwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();  // clear the error
      GTEST_SKIP() << "no CUDA device";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaDeviceProp prop;
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    arch_ = prop.major * 10 + prop.minor;
    sm_count_ = prop.multiProcessorCount;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }

  absl::StatusOr<const CompiledElementwise*> Get(const Program& program, DType out) {
    double seconds = -1;
    absl::StatusOr<const CompiledElementwise*> k = Kernels().Get(program, out, arch_, &seconds);
    EXPECT_GE(seconds, 0);
    return k;
  }

  // Runs `program` on the GPU and on the CPU over the same inputs and compares.
  void RunAndCompare(const Program& program, DType out_dtype, int64_t n, int ulps,
                     const RunOptions& options = {}) {
    const std::string what =
        absl::StrCat(program.canonical(), " -> ", DTypeName(out_dtype), ", n=", n);
    const std::vector<HostArray> inputs = MakeInputs(program, n, options.seed);

    // The reference.
    static cpu::ThreadPool* pool = new cpu::ThreadPool(0);
    std::vector<const void*> host_pointers(inputs.size(), nullptr);
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].bytes.empty()) host_pointers[k] = inputs[k].bytes.data();
    }
    HostArray want(out_dtype, n);
    cpu::EvaluateElementwise(program, host_pointers, want.bytes.data(), out_dtype, n, *pool);

    // The GPU.
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    std::vector<const void*> device_pointers(inputs.size(), nullptr);
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (std::get_if<ArrayInput>(&program.input_types()[k]) == nullptr) continue;
      const size_t size = DTypeSize(inputs[k].dtype);
      const size_t offset = options.misalign_inputs ? size : 0;
      // Room for the largest output too, for in-place runs.
      buffers.push_back(std::make_unique<DeviceBuffer>(offset + static_cast<size_t>(n) * 8));
      char* p = buffers.back()->data() + offset;
      if (n > 0) {
        ASSERT_EQ(
            cudaMemcpy(p, inputs[k].bytes.data(), inputs[k].bytes.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
      }
      device_pointers[k] = p;
    }
    const size_t out_size = DTypeSize(out_dtype);
    DeviceBuffer out_buffer(out_size + static_cast<size_t>(n) * out_size);
    char* out = out_buffer.data() + (options.misalign_out ? out_size : 0);
    if (options.in_place >= 0) {
      ASSERT_NE(device_pointers[options.in_place], nullptr);
      out = const_cast<char*>(static_cast<const char*>(device_pointers[options.in_place]));
    }

    absl::StatusOr<const CompiledElementwise*> kernel = Get(program, out_dtype);
    ASSERT_OK(kernel);
    absl::Status launched =
        LaunchElementwise(**kernel, program, device_pointers, out, n, sm_count_, stream_);
    ASSERT_OK(launched);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    HostArray got(out_dtype, n);
    if (n > 0) {
      ASSERT_EQ(cudaMemcpy(got.bytes.data(), out, got.bytes.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    ExpectMatches(got, want, ulps, inputs, what);
  }

  int arch_ = 0;
  int sm_count_ = 0;
  cudaStream_t stream_ = nullptr;
};

Program MustCompile(std::string_view text, const InputMap& inputs) {
  absl::StatusOr<Program> program = expr::Compile(text, inputs);
  EXPECT_OK(program) << text;
  return program.ok() ? *program : *expr::Compile("0", {});
}

// ---- every op at every dtype ----

struct OpCase {
  std::string name;
  std::string text;  // over arrays x, y (dtype) and c (bool)
  DType dtype;       // of x and y
  DType out;
  int ulps = 0;
};

// Names the case in test listings (instead of its bytes).
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.text << " -> " << DTypeName(c.out); }

std::vector<DType> AllDtypes() {
  return {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64};
}

// The math library's functions are approximations on both sides. CUDA documents at most
// 2 ulps (double) and 1-3 ulps (float) for these, 4 for tanf and powf; glibc stays within
// ~1 ulp. Everything else is IEEE-exact (+ - * /, sqrt, floor, ceil, abs, min, max) or
// integer, and must match bit for bit.
int Tolerance(std::string_view fn, DType dtype) {
  for (std::string_view exact : {"sqrt", "floor", "ceil", "abs"}) {
    if (fn == exact) return 0;
  }
  if (dtype == DType::kFloat32 && (fn == "tan" || fn == "pow")) return 5;
  return 4;
}

std::vector<OpCase> OpCases() {
  std::vector<OpCase> cases;
  auto add = [&](std::string name, std::string text, DType t, DType out, int ulps) {
    cases.push_back({absl::StrCat(name, "_", DTypeName(t)), std::move(text), t, out, ulps});
  };
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    for (std::string fn : {"sin", "cos", "tan", "exp", "log", "log1p", "expm1", "sqrt", "tanh",
                           "sinh", "cosh", "asin", "acos", "atan", "floor", "ceil"}) {
      add(fn, absl::StrCat(fn, "(x)"), t, t, Tolerance(fn, t));
    }
    add("div", "x / y", t, t, 0);
    add("atan2", "atan2(x, y)", t, t, Tolerance("atan2", t));
  }
  for (DType t : {DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64}) {
    add("neg", "-x", t, t, 0);
    add("abs", "abs(x)", t, t, 0);
    add("add", "x + y", t, t, 0);
    add("sub", "x - y", t, t, 0);
    add("mul", "x * y", t, t, 0);
    add("pow", "x ** y", t, t, IsFloat(t) ? Tolerance("pow", t) : 0);
  }
  for (DType t : AllDtypes()) {
    add("min", "min(x, y)", t, t, 0);
    add("max", "max(x, y)", t, t, 0);
    add("lt", "x < y", t, DType::kBool, 0);
    add("le", "x <= y", t, DType::kBool, 0);
    add("gt", "x > y", t, DType::kBool, 0);
    add("ge", "x >= y", t, DType::kBool, 0);
    add("eq", "x == y", t, DType::kBool, 0);
    add("ne", "x != y", t, DType::kBool, 0);
    add("where", "where(c, x, y)", t, t, 0);
    // A non-bool condition (x != 0) choosing between x and y.
    add("where_nonbool", "where(x, y, x)", t, t, 0);
    // Every output conversion, including float -> int (saturating) and anything -> bool.
    for (DType out : AllDtypes()) {
      add(absl::StrCat("convert_to_", DTypeName(out)), "x", t, out, 0);
      // The casts of the language follow the same rule.
      add(absl::StrCat("cast_to_", DTypeName(out)), absl::StrCat(DTypeName(out), "(x)"), t, out, 0);
    }
  }
  // NumPy's functions added with their names. rint, trunc, degrees, radians, copysign, the
  // divisions and remainders (npy_divmod is exact steps), sign, square, reciprocal and
  // everything on integers and bools are exact on both sides and must match bit for bit;
  // the math library's functions within CUDA's documented error plus glibc's ulp.
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    for (std::string fn : {"rint", "trunc", "degrees", "radians"}) {
      add(fn, absl::StrCat(fn, "(x)"), t, t, 0);
    }
    for (std::string fn : {"exp2", "log2", "log10", "cbrt", "arcsinh", "arccosh", "arctanh"}) {
      add(fn, absl::StrCat(fn, "(x)"), t, t, fn == "arccosh" && t == DType::kFloat32 ? 5 : 4);
    }
    add("hypot", "hypot(x, y)", t, t, 4);
    add("copysign", "copysign(x, y)", t, t, 0);
    add("round_2", "round(x, 2)", t, t, 0);
  }
  for (DType t : {DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64}) {
    add("floor_divide", "x // y", t, t, 0);
    add("remainder", "x % y", t, t, 0);
    add("fmod", "fmod(x, y)", t, t, 0);
    add("sign", "sign(x)", t, t, 0);
    add("square", "square(x)", t, t, 0);
    add("reciprocal", "reciprocal(x)", t, t, 0);
    add("round_minus_1", "round(x, -1)", t, t, 0);
  }
  for (DType t : {DType::kInt32, DType::kInt64}) {
    add("left_shift", "x << y", t, t, 0);
    add("right_shift", "x >> y", t, t, 0);
  }
  for (DType t : {DType::kBool, DType::kInt32, DType::kInt64}) {
    add("bitwise", "(x & y) ^ (x | ~y)", t, t, 0);
  }
  for (DType t : AllDtypes()) {
    add("fmax", "fmax(x, y)", t, t, 0);
    add("fmin", "fmin(x, y)", t, t, 0);
    add("clip", "clip(x, y, x)", t, t, 0);
    add("float_tests", "isnan(x) | isinf(x) ^ isfinite(y) & signbit(y)", t, DType::kBool, 0);
    add("logical", "logical_and(x, y) ^ logical_or(x, y) | logical_xor(x, y) | logical_not(x)", t,
        DType::kBool, 0);
  }
  return cases;
}

class CudaOpTest : public CudaElementwiseTest, public ::testing::WithParamInterface<OpCase> {};

TEST_P(CudaOpTest, MatchesCpu) {
  const OpCase& c = GetParam();
  InputMap inputs = {{"x", ArrayInput{c.dtype}}};
  if (c.text.find('y') != std::string::npos) inputs["y"] = ArrayInput{c.dtype};
  if (c.text.find("c,") != std::string::npos) inputs["c"] = ArrayInput{DType::kBool};
  const Program program = MustCompile(c.text, inputs);
  // 40009: all pairs of specials and then random values, with a tail for every pack width.
  RunAndCompare(program, c.out, 40009, c.ulps);
}

INSTANTIATE_TEST_SUITE_P(EveryOp, CudaOpTest, ::testing::ValuesIn(OpCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           return info.param.name;
                         });

// ---- expressions ----

InputMap MixedInputs() {
  return {{"f", ArrayInput{DType::kFloat32}}, {"g", ArrayInput{DType::kFloat32}},
          {"d", ArrayInput{DType::kFloat64}}, {"e", ArrayInput{DType::kFloat64}},
          {"i", ArrayInput{DType::kInt32}},   {"j", ArrayInput{DType::kInt32}},
          {"l", ArrayInput{DType::kInt64}},   {"m", ArrayInput{DType::kInt64}},
          {"b", ArrayInput{DType::kBool}},    {"c", ArrayInput{DType::kBool}}};
}

InputMap Only(const InputMap& all, std::initializer_list<std::string> names) {
  InputMap out;
  for (const std::string& n : names) out.emplace(n, all.at(n));
  return out;
}

TEST_F(CudaElementwiseTest, PromotionsAreExact) {
  const InputMap in = Only(MixedInputs(), {"b", "i", "j", "l", "f", "d"});
  const Program program = MustCompile(
      "(b + i) * (i + l) + (b + l) + (b + f) + (b + d) + (i + f) + (l + d) + (f + d) + i / j", in);
  RunAndCompare(program, DType::kFloat64, 10007, 0);
  RunAndCompare(program, DType::kInt64, 10007, 0);  // saturating float -> int64
  RunAndCompare(program, DType::kFloat32, 10007, 0);
}

TEST_F(CudaElementwiseTest, LiteralsAreExact) {
  const InputMap in = Only(MixedInputs(), {"b", "f", "d", "e", "l", "i"});
  const Program program = MustCompile(
      "where(b, f + 0.1, f * 1e-45) + (d * 5e-324 + 1e400) + (e - 1e400) + "
      "(1e400 - 1e400) * d + f * (1e400 - 1e400) + (f + 1e400) + -0.0 * f + "
      "(l + (-9223372036854775807 - 1)) + (l * 9223372036854775807) + "
      "(i + (-2147483647 - 1)) + (i - 2147483647) + max(b, True) + 0.1 * d",
      in);
  RunAndCompare(program, DType::kFloat64, 10007, 0);
  // Integer literal edges on their own (the sum above is mostly inf and NaN).
  const Program ints = MustCompile(
      "(l + (-9223372036854775807 - 1)) * (l - 9223372036854775807) + "
      "(i * (-2147483647 - 1) - 2147483647 + i ** 3)",
      Only(MixedInputs(), {"l", "i"}));
  RunAndCompare(ints, DType::kInt64, 10007, 0);
  const Program floats = MustCompile("f * 0.1 + f * 1e-45 - 3.4028234663852886e38 + -0.0 * f",
                                     Only(MixedInputs(), {"f"}));
  RunAndCompare(floats, DType::kFloat32, 10007, 0);
}

TEST_F(CudaElementwiseTest, ParametersOfEveryDtypeReuseOneKernel) {
  const std::string text = "where(sb, f * sf + si, g) + d * sf + i * si + (l - si) + max(b, sb)";
  InputMap in = Only(MixedInputs(), {"f", "g", "d", "i", "l", "b"});
  const int64_t before = Kernels().nvrtc_compilations();
  const CompiledElementwise* first = nullptr;
  int runs = 0;
  for (double sf : {2.5, -0.1, std::numeric_limits<double>::infinity()}) {
    for (int64_t si : {int64_t{3}, int64_t{-2147483647 - 1}}) {
      for (int64_t sb : {0, 1}) {
        in["sf"] = ScalarInput{DType::kFloat64, sf};
        in["si"] = ScalarInput{DType::kInt64, 0, si};
        in["sb"] = ScalarInput{DType::kBool, 0, sb};
        const Program program = MustCompile(text, in);
        absl::StatusOr<const CompiledElementwise*> k = Get(program, DType::kFloat64);
        ASSERT_OK(k);
        if (first == nullptr) first = *k;
        EXPECT_EQ(*k, first);
        RunAndCompare(program, DType::kFloat64, 4099, 0, {.seed = static_cast<uint64_t>(++runs)});
      }
    }
  }
  EXPECT_LE(Kernels().nvrtc_compilations() - before, 1);
}

TEST_F(CudaElementwiseTest, AxpyScalarValuesShareTheKernel) {
  InputMap in = Only(MixedInputs(), {"f", "g"});
  in["a"] = ScalarInput{DType::kFloat64, 2.0};
  const Program p2 = MustCompile("a*f + g", in);
  in["a"] = ScalarInput{DType::kFloat64, -0.75};
  const Program p3 = MustCompile("a*f + g", in);
  double seconds = -1;
  absl::StatusOr<const CompiledElementwise*> k2 =
      Kernels().Get(p2, DType::kFloat32, arch_, &seconds);
  ASSERT_OK(k2);
  const int64_t compiled = Kernels().nvrtc_compilations();
  absl::StatusOr<const CompiledElementwise*> k3 =
      Kernels().Get(p3, DType::kFloat32, arch_, &seconds);
  ASSERT_OK(k3);
  EXPECT_EQ(*k2, *k3);
  EXPECT_EQ(seconds, 0);  // a memory-cache hit
  EXPECT_EQ(Kernels().nvrtc_compilations(), compiled);
  RunAndCompare(p2, DType::kFloat32, 100003, 0);
  RunAndCompare(p3, DType::kFloat32, 100003, 0);
}

TEST_F(CudaElementwiseTest, OneProgramHasAKernelPerOutputDtypeEachBuiltOnce) {
  // The cache's key is the program's canonical form, the output dtype and the
  // architecture: a program written as float32 and as float64 is two kernels, and each
  // is found again, built, without compiling.
  const Program program = MustCompile("f * 3 - g", Only(MixedInputs(), {"f", "g"}));
  double seconds = -1;
  absl::StatusOr<const CompiledElementwise*> narrow =
      Kernels().Get(program, DType::kFloat32, arch_, &seconds);
  ASSERT_OK(narrow);
  absl::StatusOr<const CompiledElementwise*> wide =
      Kernels().Get(program, DType::kFloat64, arch_, &seconds);
  ASSERT_OK(wide);
  EXPECT_NE(*narrow, *wide);
  EXPECT_EQ((*narrow)->out_dtype, DType::kFloat32);
  EXPECT_EQ((*wide)->out_dtype, DType::kFloat64);
  const int64_t compiled = Kernels().nvrtc_compilations();
  for (DType out : {DType::kFloat32, DType::kFloat64}) {
    seconds = -1;
    absl::StatusOr<const CompiledElementwise*> again = Kernels().Get(program, out, arch_, &seconds);
    ASSERT_OK(again);
    EXPECT_EQ(*again, out == DType::kFloat32 ? *narrow : *wide);
    EXPECT_EQ(seconds, 0);
  }
  EXPECT_EQ(Kernels().nvrtc_compilations(), compiled);
  RunAndCompare(program, DType::kFloat32, 1001, 0);
  RunAndCompare(program, DType::kFloat64, 1001, 0);
}

TEST_F(CudaElementwiseTest, SizesAndTails) {
  const InputMap all = MixedInputs();
  InputMap axpy_in = Only(all, {"f", "g"});
  axpy_in["a"] = ScalarInput{DType::kFloat64, 1.5};
  const Program axpy = MustCompile("a*f + g", axpy_in);                     // 4 per pack
  const Program wide = MustCompile("d < e", Only(all, {"d", "e"}));         // 16 per pack, bool out
  const Program doubles = MustCompile("d * e - d", Only(all, {"d", "e"}));  // 2 per pack
  const Program bools = MustCompile("max(b, c)", Only(all, {"b", "c"}));    // 16, all bytes
  for (int64_t n : {0, 1, 3, 15, 16, 17, 33, 1000003}) {
    SCOPED_TRACE(n);
    RunAndCompare(axpy, DType::kFloat32, n, 0);
    RunAndCompare(wide, DType::kBool, n, 0);
    RunAndCompare(doubles, DType::kFloat64, n, 0);
    RunAndCompare(bools, DType::kBool, n, 0);
  }
}

TEST_F(CudaElementwiseTest, MisalignedPointersUseTheScalarKernel) {
  const InputMap all = MixedInputs();
  const Program axpy = MustCompile("f * 3 + g", Only(all, {"f", "g"}));
  const Program mixed = MustCompile("where(b, d, e) > l", Only(all, {"b", "d", "e", "l"}));
  for (int64_t n : {1, 7, 100003}) {
    SCOPED_TRACE(n);
    RunAndCompare(axpy, DType::kFloat32, n, 0, {.misalign_inputs = true});
    RunAndCompare(axpy, DType::kFloat32, n, 0, {.misalign_out = true});
    RunAndCompare(axpy, DType::kFloat32, n, 0, {.misalign_inputs = true, .misalign_out = true});
    RunAndCompare(mixed, DType::kBool, n, 0, {.misalign_inputs = true});
    RunAndCompare(mixed, DType::kBool, n, 0);
  }
}

TEST_F(CudaElementwiseTest, InPlace) {
  const InputMap all = MixedInputs();
  // inputs() is sorted: f is 0, g is 1.
  const Program axpy = MustCompile("f * 2 + g", Only(all, {"f", "g"}));
  RunAndCompare(axpy, DType::kFloat32, 1000003, 0, {.in_place = 0});
  RunAndCompare(axpy, DType::kFloat32, 1000003, 0, {.in_place = 1});
  RunAndCompare(axpy, DType::kFloat32, 1001, 0, {.misalign_inputs = true, .in_place = 0});
  // Output element size differs from the input's: a float32 result over a float64 input
  // (and a bool over it) overlap without coinciding, so the launcher goes through a
  // temporary.
  const Program narrow = MustCompile("d * 0.5", Only(all, {"d"}));
  RunAndCompare(narrow, DType::kFloat32, 1000003, 0, {.in_place = 0});
  const Program test = MustCompile("d > 0", Only(all, {"d"}));
  RunAndCompare(test, DType::kBool, 100003, 0, {.in_place = 0});
}

TEST_F(CudaElementwiseTest, ReferenceExpression) {
  const std::string text = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(DTypeName(t));
    const Program program = MustCompile(text, {{"x", ArrayInput{t}}});
    // Five library functions in a row: each contributes its few ulps, and the final
    // square root halves the relative error.
    RunAndCompare(program, t, int64_t{1} << 20, 8);
  }
}

TEST_F(CudaElementwiseTest, ConcurrentGetsCompileOnce) {
  const Program program = MustCompile("f * g - g * 7 + f", Only(MixedInputs(), {"f", "g"}));
  const int64_t before = Kernels().nvrtc_compilations();
  std::vector<const CompiledElementwise*> got(4, nullptr);
  std::vector<std::thread> threads;
  for (auto& g : got) {
    threads.emplace_back([&, out = &g] {
      double seconds = 0;
      absl::StatusOr<const CompiledElementwise*> k =
          Kernels().Get(program, DType::kFloat32, arch_, &seconds);
      if (k.ok()) *out = *k;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const CompiledElementwise* k : got) {
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k, got[0]);
  }
  EXPECT_EQ(Kernels().nvrtc_compilations() - before, 1);
}

TEST_F(CudaElementwiseTest, OwnInstanceLoadsAndUnloads) {
  // A separate instance, destroyed at the end of the test: its destructor unloads the
  // library (a failure would be logged, and a later use of the device would show it).
  const Program program = MustCompile("f + g", Only(MixedInputs(), {"f", "g"}));
  {
    ElementwiseKernels kernels("");
    double seconds = -1;
    absl::StatusOr<const CompiledElementwise*> k =
        kernels.Get(program, DType::kFloat32, arch_, &seconds);
    ASSERT_OK(k);
    EXPECT_GT(seconds, 0);
    EXPECT_EQ(kernels.nvrtc_compilations(), 1);
  }
  RunAndCompare(program, DType::kFloat32, 1000, 0);
}

TEST_F(CudaElementwiseTest, LaunchArgumentErrors) {
  const InputMap in = Only(MixedInputs(), {"f", "g"});
  const Program program = MustCompile("f + g", in);
  const Program other = MustCompile("f - g", in);
  absl::StatusOr<const CompiledElementwise*> k = Get(program, DType::kFloat32);
  ASSERT_OK(k);
  DeviceBuffer a(64), b(64), out(64);
  const std::vector<const void*> pointers = {a.data(), b.data()};
  EXPECT_EQ(LaunchElementwise(**k, other, pointers, out.data(), 4, sm_count_, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<const void*> null_input = {a.data(), nullptr};
  EXPECT_EQ(LaunchElementwise(**k, program, null_input, out.data(), 4, sm_count_, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchElementwise(**k, program, pointers, out.data(), -1, sm_count_, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<const void*> too_few = {a.data()};
  EXPECT_EQ(LaunchElementwise(**k, program, too_few, out.data(), 4, sm_count_, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_OK(LaunchElementwise(**k, program, pointers, out.data(), 0, sm_count_, stream_));
  // The kernel library's entry point checks its own arguments too.
  const uint64_t* no_parameters = nullptr;
  EXPECT_EQ(ElementwiseAsync((*k)->signature, (*k)->kernels, pointers.data(), out.data(), -1,
                             no_parameters, sm_count_, stream_),
            cudaErrorInvalidValue);
  EXPECT_EQ(ElementwiseAsync((*k)->signature, (*k)->kernels, pointers.data(), out.data(), 4,
                             no_parameters, 0, stream_),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// ---- strided arrays: views and broadcast operands (the strided kernel) ----

// An array read or written through a layout over a buffer of `memory` elements (offsets
// and strides in elements, as StridedLayout's). A 16-byte-aligned buffer: an offset that
// is not a multiple of the pack misaligns the row starts.
struct StridedOperand {
  int64_t memory = 0;
  int64_t offset = 0;
  std::vector<int64_t> strides;
};

// The C-order element positions of `op` over `shape`, by brute force.
std::vector<int64_t> Positions(const std::vector<int64_t>& shape, const StridedOperand& op) {
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  std::vector<int64_t> positions(n);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t position = op.offset;
    for (size_t d = 0; d < shape.size(); ++d) position += index[d] * op.strides[d];
    positions[i] = position;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return positions;
}

// A C-contiguous operand of `shape`.
StridedOperand Dense(const std::vector<int64_t>& shape) {
  StridedOperand op;
  op.strides.resize(shape.size());
  int64_t stride = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    op.strides[d] = stride;
    stride *= shape[d];
  }
  op.memory = stride;
  return op;
}

struct StridedRun {
  std::vector<int64_t> shape;
  std::vector<StridedOperand> inputs;  // parallel to program.inputs(); scalars' are ignored
  StridedOperand out;
  int in_place = -1;  // the output goes into this input's buffer (its memory, same dtype)
};

// A backend of its own for the tests that go through Backend::ElementwiseStrided; never
// destroyed, like Kernels().
Backend& CudaBackendForTests() {
  static Backend* backend = [] {
    absl::StatusOr<std::unique_ptr<Backend>> created = CreateCudaBackend({});
    EXPECT_OK(created);
    return created.ok() ? created->release() : nullptr;
  }();
  return *backend;
}

class CudaStridedTest : public CudaElementwiseTest {
 protected:
  // Runs `program` over the layouts of `run` on the GPU, through the kernel library
  // (`through_backend` false: the strided kernel of the layouts' specialisation, as given)
  // or through CudaBackend::ElementwiseStrided, and compares the whole output buffer
  // with the CPU evaluator's results over the inputs gathered by a brute-force strided
  // loop, scattered the same way: elements outside the output layout keep their values.
  void RunStrided(const Program& program, DType out_dtype, const StridedRun& run,
                  bool through_backend, int ulps = 0) {
    const std::string what =
        absl::StrCat(program.canonical(), " -> ", DTypeName(out_dtype), " over ",
                     absl::StrJoin(run.shape, "x"), through_backend ? " (backend)" : " (kernel)");
    SCOPED_TRACE(what);
    int64_t n = 1;
    for (int64_t extent : run.shape) n *= extent;
    int64_t memory = run.out.memory;
    for (const StridedOperand& op : run.inputs) memory = std::max(memory, op.memory);
    const std::vector<HostArray> memories = MakeInputs(program, memory, 11);

    // The reference: gathered inputs, evaluated contiguously, scattered.
    std::vector<HostArray> gathered(memories.size());
    std::vector<const void*> host_pointers(memories.size(), nullptr);
    for (size_t k = 0; k < memories.size(); ++k) {
      if (memories[k].bytes.empty()) continue;
      const size_t size = DTypeSize(memories[k].dtype);
      gathered[k] = HostArray(memories[k].dtype, n);
      const std::vector<int64_t> positions = Positions(run.shape, run.inputs[k]);
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(gathered[k].bytes.data() + i * size,
                    memories[k].bytes.data() + positions[i] * size, size);
      }
      host_pointers[k] = gathered[k].bytes.data();
    }
    static cpu::ThreadPool* pool = new cpu::ThreadPool(0);
    HostArray results(out_dtype, n);
    cpu::EvaluateElementwise(program, host_pointers, results.bytes.data(), out_dtype, n, *pool);
    HostArray want(out_dtype, run.out.memory);
    if (run.in_place >= 0) {
      ASSERT_EQ(memories[run.in_place].dtype, out_dtype);
      want = memories[run.in_place];
      want.n = run.out.memory;
      want.bytes.resize(run.out.memory * DTypeSize(out_dtype));
    } else {
      std::mt19937_64 rng(5);
      FillRandom(want, rng);  // what the output buffer holds before
    }
    const HostArray before = want;
    const size_t out_size = DTypeSize(out_dtype);
    const std::vector<int64_t> out_positions = Positions(run.shape, run.out);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(want.bytes.data() + out_positions[i] * out_size,
                  results.bytes.data() + i * out_size, out_size);
    }

    // The GPU: a buffer per array input, and the output's (or the in-place input's).
    Backend* backend = through_backend ? &CudaBackendForTests() : nullptr;
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    std::vector<DeviceMemory> backend_memories;
    backend_memories.reserve(memories.size() + 1);
    auto allocate = [&](const HostArray& contents) -> char* {
      const size_t bytes = std::max<size_t>(contents.bytes.size(), 1);
      char* p = nullptr;
      if (backend != nullptr) {
        absl::StatusOr<DeviceMemory> m = backend->Allocate(0, bytes);
        EXPECT_OK(m);
        if (!m.ok()) return nullptr;
        backend_memories.push_back(*std::move(m));
        p = static_cast<char*>(backend_memories.back().data());
      } else {
        buffers.push_back(std::make_unique<DeviceBuffer>(bytes));
        p = buffers.back()->data();
      }
      EXPECT_EQ(cudaMemcpy(p, contents.bytes.data(), contents.bytes.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      return p;
    };
    std::vector<char*> device(memories.size(), nullptr);
    std::vector<const DeviceMemory*> device_memories(memories.size(), nullptr);
    for (size_t k = 0; k < memories.size(); ++k) {
      if (memories[k].bytes.empty()) continue;
      device[k] = allocate(memories[k]);
      ASSERT_NE(device[k], nullptr);
      if (backend != nullptr) device_memories[k] = &backend_memories.back();
    }
    char* out = nullptr;
    DeviceMemory* out_memory = nullptr;
    if (run.in_place >= 0) {
      out = device[run.in_place];
      if (backend != nullptr) out_memory = const_cast<DeviceMemory*>(device_memories[run.in_place]);
    } else {
      out = allocate(before);
      ASSERT_NE(out, nullptr);
      if (backend != nullptr) out_memory = &backend_memories.back();
    }

    if (backend != nullptr) {
      std::vector<StridedInput> inputs(memories.size());
      for (size_t k = 0; k < memories.size(); ++k) {
        if (device_memories[k] == nullptr) continue;
        inputs[k].memory = device_memories[k];
        inputs[k].layout = {run.shape, run.inputs[k].strides, run.inputs[k].offset};
      }
      absl::StatusOr<std::unique_ptr<Stream>> stream = backend->CreateStream(0);
      ASSERT_OK(stream);
      const StridedLayout out_layout{run.shape, run.out.strides, run.out.offset};
      ASSERT_OK(backend->ElementwiseStrided(**stream, program, inputs, *out_memory, out_layout,
                                            out_dtype));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    } else {
      std::vector<StridedArray> arrays(memories.size());
      for (size_t k = 0; k < memories.size(); ++k) {
        if (device[k] == nullptr) continue;
        arrays[k].data = device[k];
        arrays[k].offset = run.inputs[k].offset;
        std::copy(run.inputs[k].strides.begin(), run.inputs[k].strides.end(), arrays[k].strides);
      }
      StridedArray out_array;
      out_array.data = out;
      out_array.offset = run.out.offset;
      std::copy(run.out.strides.begin(), run.out.strides.end(), out_array.strides);
      const StridedSpecialization spec =
          SpecializationOf(program, arrays, out_array, run.shape, out_dtype);
      last_specialization_ = spec;
      double seconds = -1;
      absl::StatusOr<const CompiledStridedElementwise*> kernel =
          Kernels().GetStrided(program, out_dtype, spec, arch_, &seconds);
      ASSERT_OK(kernel);
      ASSERT_OK(LaunchElementwiseStrided(**kernel, program, arrays, out_array, run.shape,
                                         sm_count_, stream_));
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    }
    HostArray got(out_dtype, run.out.memory);
    ASSERT_EQ(cudaMemcpy(got.bytes.data(), out, got.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ExpectMatches(got, want, ulps, {}, what);
  }

  // Both ways (the kernel library's only for one axis or more).
  void RunBoth(const Program& program, DType out_dtype, const StridedRun& run, int ulps = 0) {
    if (!run.shape.empty()) RunStrided(program, out_dtype, run, /*through_backend=*/false, ulps);
    RunStrided(program, out_dtype, run, /*through_backend=*/true, ulps);
  }

  // What the kernel library's path of the last RunStrided launched.
  StridedSpecialization last_specialization_;
};

// The rows kernel (kernels/cuda/elementwise/rows.cuh.in): x - m with m a column (n, 1),
// a row (1, m) or 0-d, on either side, mixed with a contiguous operand and a literal,
// rows of whole packs from aligned starts, views of whole rows as an input and as the
// output, in place. Beside them, layouts that miss its conditions by a little (a row of
// an odd length, a misaligned start or row stride) take the strided kernel; both give
// the CPU's results.
TEST_F(CudaStridedTest, RowsKernel) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  const Program mixed = MustCompile("f * 0.5 - g + d", Only(MixedInputs(), {"d", "f", "g"}));
  for (int64_t cols : {4, 64, 1024, 4100}) {
    SCOPED_TRACE(cols);
    const std::vector<int64_t> shape = {37, cols};
    const StridedOperand x = Dense(shape);
    const StridedOperand column{37, 0, {1, 0}};
    const StridedOperand row{cols, 0, {0, 1}};
    const StridedOperand zero_dim{8, 4, {0, 0}};
    for (const StridedOperand& m : {column, row, zero_dim}) {
      RunBoth(program, DType::kFloat32, {shape, {x, m}, x});
      EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();
      RunBoth(program, DType::kFloat32, {shape, {m, x}, x});
      EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();
    }
    RunBoth(mixed, DType::kFloat64, {shape, {x, row, column}, x});
    EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();
    RunBoth(mixed, DType::kFloat64, {shape, {x, zero_dim, row}, x});
    EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();
    // Whole rows of a wider array, 16 bytes in: an input, the output, and both (in place).
    const StridedOperand view{37 * (cols + 8), 4, {cols + 8, 1}};
    RunBoth(program, DType::kFloat32, {shape, {view, column}, x});
    EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();
    RunBoth(program, DType::kFloat32, {shape, {x, row}, view});
    EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();
    RunBoth(program, DType::kFloat32, {shape, {view, zero_dim}, view, 0});
    EXPECT_TRUE(last_specialization_.rows) << last_specialization_.Name();

    // Misaligned: the first row (4 bytes in), the row stride (cols + 1 elements).
    const StridedOperand shifted{37 * (cols + 8), 1, {cols + 8, 1}};
    const StridedOperand odd_rows{37 * (cols + 1), 0, {cols + 1, 1}};
    for (const StridedOperand& y : {shifted, odd_rows}) {
      RunBoth(program, DType::kFloat32, {shape, {y, column}, x});
      EXPECT_FALSE(last_specialization_.rows) << last_specialization_.Name();
      RunBoth(program, DType::kFloat32, {shape, {x, row}, y});
      EXPECT_FALSE(last_specialization_.rows) << last_specialization_.Name();
    }
  }
  // Rows not a whole number of packs of 4.
  for (int64_t cols : {1, 3, 1001}) {
    SCOPED_TRACE(cols);
    const std::vector<int64_t> shape = {37, cols};
    RunBoth(program, DType::kFloat32, {shape, {Dense(shape), {37, 0, {1, 0}}}, Dense(shape)});
    EXPECT_FALSE(last_specialization_.rows) << last_specialization_.Name();
    RunBoth(mixed, DType::kFloat64,
            {shape, {Dense(shape), {cols, 0, {0, 1}}, {8, 4, {0, 0}}}, Dense(shape)});
    EXPECT_FALSE(last_specialization_.rows) << last_specialization_.Name();
  }
}

// A rows kernel launched over layouts it cannot read (a misaligned row start) is refused
// before anything runs; the strided kernel of the same row steps takes layouts that would
// fit the rows kernel.
TEST_F(CudaStridedTest, RowsKernelRefusesLayoutsThatDoNotFit) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  const StridedSpecialization rows{2, {RowStep::kUnit, RowStep::kBroadcast}, RowStep::kUnit, true};
  absl::StatusOr<const CompiledStridedElementwise*> k =
      Kernels().GetStrided(program, DType::kFloat32, rows, arch_, nullptr);
  ASSERT_OK(k);
  DeviceBuffer a(256), b(64), out(256);
  ASSERT_EQ(cudaMemset(out.data(), 0x5a, 256), cudaSuccess);
  const std::vector<int64_t> shape = {4, 8};
  const StridedArray y{out.data(), 0, {8, 1}};
  const std::vector<StridedArray> good = {StridedArray{a.data(), 0, {8, 1}},
                                          StridedArray{b.data(), 0, {1, 0}}};
  const std::vector<StridedArray> shifted = {StridedArray{a.data(), 1, {8, 1}},
                                             StridedArray{b.data(), 0, {1, 0}}};
  absl::Status wrong =
      LaunchElementwiseStrided(**k, program, shifted, y, shape, sm_count_, stream_);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.message(),
            "the layouts are of the strided specialisation 2d:ub>u, the kernel of rows:ub>u");
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  std::vector<uint8_t> bytes(256);
  ASSERT_EQ(cudaMemcpy(bytes.data(), out.data(), bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x5a), 256);
  EXPECT_OK(LaunchElementwiseStrided(**k, program, good, y, shape, sm_count_, stream_));
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// A 0-d operand of a one-axis operation takes the contiguous kernels as a pointer to its
// one element (through the backend): on either side, with a literal, over lengths that
// are and are not whole packs, aligned (the vector kernel) or not (the scalar one), in
// place. Through the kernel library, an output over the 0-d element itself (x -= x[5])
// goes through a temporary, so that every element sees the value from before.
TEST_F(CudaStridedTest, ZeroDimOperandOnTheContiguousKernel) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  const Program literal = MustCompile("f * 0.5 - g", Only(MixedInputs(), {"f", "g"}));
  const StridedOperand zero_dim{8, 5, {0}};
  for (int64_t n : {1, 3, 4, 1003, 100000}) {
    SCOPED_TRACE(n);
    const std::vector<int64_t> line = {n};
    RunBoth(program, DType::kFloat32, {line, {Dense(line), zero_dim}, Dense(line)});
    RunBoth(program, DType::kFloat32, {line, {zero_dim, Dense(line)}, Dense(line)});
    RunBoth(literal, DType::kFloat32, {line, {zero_dim, Dense(line)}, Dense(line)});
    RunBoth(literal, DType::kFloat32, {line, {{n + 1, 1, {1}}, zero_dim}, {n + 3, 3, {1}}});
    RunBoth(program, DType::kFloat32, {line, {Dense(line), zero_dim}, Dense(line), 0});
  }

  const std::vector<bool> constant = {false, true};
  double seconds = -1;
  absl::StatusOr<const CompiledElementwise*> k =
      Kernels().Get(program, DType::kFloat32, arch_, &seconds, constant);
  ASSERT_OK(k);
  EXPECT_EQ((*k)->signature.array_constant, constant);
  absl::StatusOr<const CompiledElementwise*> plain =
      Kernels().Get(program, DType::kFloat32, arch_, &seconds);
  ASSERT_OK(plain);
  EXPECT_NE(*k, *plain);
  const int64_t n = 100003;
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = 0.25f * static_cast<float>(i % 1000) - 7;
  DeviceBuffer x(n * sizeof(float));
  ASSERT_EQ(cudaMemcpy(x.data(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  auto* xp = reinterpret_cast<float*>(x.data());
  const std::vector<const void*> pointers = {xp, xp + 5};
  ASSERT_OK(LaunchElementwise(**k, program, pointers, xp, n, sm_count_, stream_));
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  std::vector<float> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), xp, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], host[i] - host[5]) << i;
}

// x - m with m of shape (n, 1), (1, m) and (), over rows with and without a tail, from
// aligned and misaligned row starts.
TEST_F(CudaStridedTest, Broadcasts) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  for (int64_t cols : {1000, 1001, 3}) {
    const std::vector<int64_t> shape = {37, cols};
    StridedOperand x = Dense(shape);
    StridedOperand column{37, 0, {1, 0}};
    StridedOperand row{cols, 0, {0, 1}};
    StridedOperand zero_dim{8, 5, {0, 0}};
    for (const StridedOperand& m : {column, row, zero_dim}) {
      RunBoth(program, DType::kFloat32, {shape, {x, m}, Dense(shape)});
    }
    // Misaligned row starts: x[:, 1:] of (37, cols + 1), out and m likewise shifted.
    StridedOperand shifted{37 * (cols + 1), 1, {cols + 1, 1}};
    StridedOperand column_shifted{40, 3, {1, 0}};
    RunBoth(program, DType::kFloat32, {shape, {shifted, column_shifted}, shifted});
  }
}

// A transposed operand (innermost stride large), a transposed output, in float32 and
// float64.
TEST_F(CudaStridedTest, Transposes) {
  const std::vector<int64_t> shape = {300, 200};
  StridedOperand transposed{60000, 0, {1, 300}};
  const Program f32 = MustCompile("f + g * 3", Only(MixedInputs(), {"f", "g"}));
  RunBoth(f32, DType::kFloat32, {shape, {transposed, Dense(shape)}, Dense(shape)});
  RunBoth(f32, DType::kFloat32, {shape, {Dense(shape), Dense(shape)}, transposed});
  const Program f64 = MustCompile("d * e - d", Only(MixedInputs(), {"d", "e"}));
  RunBoth(f64, DType::kFloat64, {shape, {transposed, transposed}, Dense(shape)});
  // Five transposed inputs: four through tiles, the fifth gathered.
  const Program five =
      MustCompile("b + d * e - f + l", Only(MixedInputs(), {"b", "d", "e", "f", "l"}));
  RunBoth(five, DType::kFloat64,
          {shape, {transposed, transposed, transposed, transposed, transposed}, transposed});
  // Rows that are not whole tiles, over three axes: x.transpose(1, 0, 2)[..., ::-1] seen
  // with its middle axis innermost-but-one.
  const std::vector<int64_t> shape3 = {5, 37, 45};
  StridedOperand swapped{5 * 37 * 45, 44 * 37, {45 * 37, 1, -37}};
  RunBoth(f32, DType::kFloat32, {shape3, {swapped, Dense(shape3)}, Dense(shape3)});
}

// Negative strides, ::2 and ::3 steps, reversed and strided outputs (the elements between
// stay as they were).
TEST_F(CudaStridedTest, NegativeStridesAndSteps) {
  const Program program = MustCompile("f * g - f", Only(MixedInputs(), {"f", "g"}));
  // x[::-1, ::-2] of a (50, 80) array.
  const std::vector<int64_t> shape = {50, 40};
  StridedOperand reversed{4000, 49 * 80 + 79, {-80, -2}};
  RunBoth(program, DType::kFloat32, {shape, {reversed, Dense(shape)}, Dense(shape)});
  RunBoth(program, DType::kFloat32, {shape, {Dense(shape), Dense(shape)}, reversed});
  // One axis: x[::2], y[::-1], out[::3].
  const std::vector<int64_t> line = {1001};
  RunBoth(program, DType::kFloat32,
          {line, {{2002, 0, {2}}, {1001, 1000, {-1}}}, {3003, 0, {3}}});
}

// 0-d buffer operands beside scalar inputs; every operand 0-d (one element).
TEST_F(CudaStridedTest, ZeroDimOperands) {
  InputMap in = Only(MixedInputs(), {"d", "f", "g"});
  in["a"] = ScalarInput{DType::kFloat64, 1.5};
  const Program program = MustCompile("a * f + g - d", in);  // inputs a, d, f, g
  const std::vector<int64_t> shape = {129, 67};
  StridedOperand zero_dim{4, 3, {0, 0}};
  RunBoth(program, DType::kFloat64, {shape, {{}, zero_dim, Dense(shape), zero_dim}, Dense(shape)});
  RunBoth(program, DType::kFloat64, {{}, {{}, {4, 1, {}}, {4, 2, {}}, {4, 3, {}}}, {4, 1, {}}});
}

// out == input with the same layout: transposed, misaligned unit rows, a step.
TEST_F(CudaStridedTest, InPlace) {
  const Program program = MustCompile("f * 2 + g", Only(MixedInputs(), {"f", "g"}));
  const std::vector<int64_t> shape = {64, 64};
  StridedOperand transposed{4096, 0, {1, 64}};
  RunBoth(program, DType::kFloat32, {shape, {transposed, Dense(shape)}, transposed, 0});
  StridedOperand shifted{64 * 1001, 1, {1001, 1}};
  const std::vector<int64_t> wide = {64, 1000};
  RunBoth(program, DType::kFloat32, {wide, {shifted, Dense(wide)}, shifted, 0});
  const std::vector<int64_t> line = {5000};
  StridedOperand step{10000, 1, {2}};
  RunBoth(program, DType::kFloat32, {line, {Dense(line), step}, step, 1});
}

// Three axes (one division per row) and eight (six), with permuted, broadcast and
// contiguous operands, float64 and bool outputs.
TEST_F(CudaStridedTest, ThreeAndEightAxes) {
  const Program mixed = MustCompile("d - f", Only(MixedInputs(), {"d", "f"}));
  // d: a (130, 7, 9) array seen as (7, 9, 130); f: (7, 1, 130) broadcast.
  const std::vector<int64_t> shape3 = {7, 9, 130};
  StridedOperand permuted{8190, 0, {9, 1, 63}};
  StridedOperand broadcast{910, 0, {130, 0, 1}};
  RunBoth(mixed, DType::kFloat64, {shape3, {permuted, broadcast}, Dense(shape3)});
  RunBoth(mixed, DType::kFloat64, {shape3, {Dense(shape3), broadcast}, permuted});

  const std::vector<int64_t> shape8 = {2, 3, 2, 3, 2, 3, 2, 35};
  // d: the axes reversed; f: extent 1 on axes 1, 3 and 5.
  StridedOperand reversed{15120, 0, {1, 2, 6, 12, 36, 72, 216, 432}};
  StridedOperand stretched{560, 0, {280, 0, 140, 0, 70, 0, 35, 1}};
  RunBoth(mixed, DType::kFloat64, {shape8, {reversed, stretched}, Dense(shape8)});
  const Program test = MustCompile("d > f", Only(MixedInputs(), {"d", "f"}));
  RunBoth(test, DType::kBool, {shape8, {stretched, reversed}, reversed});
}

// Bool, integer and float64 operands of different widths (16 elements per pack), with a
// bool output, unit and strided.
TEST_F(CudaStridedTest, BoolOutputsAndMixedWidths) {
  const Program program =
      MustCompile("where(b, d, f) > l", Only(MixedInputs(), {"b", "d", "f", "l"}));
  const std::vector<int64_t> shape = {33, 517};
  StridedOperand column{40, 1, {1, 0}};
  StridedOperand transposed{33 * 517, 0, {1, 33}};
  StridedOperand shifted{33 * 518, 1, {518, 1}};
  StridedOperand zero_dim{2, 1, {0, 0}};
  RunBoth(program, DType::kBool, {shape, {column, transposed, shifted, zero_dim}, Dense(shape)});
  RunBoth(program, DType::kBool,
          {shape, {column, transposed, shifted, zero_dim}, {33 * 1034, 0, {1034, 2}}});
  const Program bools = MustCompile("max(b, c)", Only(MixedInputs(), {"b", "c"}));
  RunBoth(bools, DType::kBool, {shape, {column, shifted}, shifted});
}

// Rows of one pack or less (a thread per row) and more rows than one grid's y extent.
TEST_F(CudaStridedTest, ShortRowsAndManyRows) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{100003, 3}, std::vector<int64_t>{300007, 2},
        std::vector<int64_t>{5, 1}}) {
    StridedOperand column{shape[0], 0, {1, 0}};
    RunBoth(program, DType::kFloat32, {shape, {Dense(shape), column}, Dense(shape)});
  }
}

// An empty iteration space writes nothing.
TEST_F(CudaStridedTest, EmptyShapeWritesNothing) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  const std::vector<int64_t> shape = {0, 5};
  RunBoth(program, DType::kFloat32, {shape, {{10, 0, {5, 1}}, {10, 0, {5, 1}}}, {10, 0, {5, 1}}});
}

// One compiled kernel per specialisation, whatever the sizes and offsets.
TEST_F(CudaStridedTest, OneKernelServesEverySize) {
  const Program program = MustCompile("f * g + g", Only(MixedInputs(), {"f", "g"}));
  const StridedSpecialization spec{2, {RowStep::kUnit, RowStep::kBroadcast}, RowStep::kUnit};
  absl::StatusOr<const CompiledStridedElementwise*> first =
      Kernels().GetStrided(program, DType::kFloat32, spec, arch_, nullptr);
  ASSERT_OK(first);
  const int64_t compiled = Kernels().nvrtc_compilations();
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{5, 7}, std::vector<int64_t>{1000, 4099},
        std::vector<int64_t>{3, 100001}}) {
    StridedOperand column{shape[0] + 9, 9, {1, 0}};
    RunStrided(program, DType::kFloat32, {shape, {Dense(shape), column}, Dense(shape)}, false);
  }
  EXPECT_EQ(Kernels().nvrtc_compilations(), compiled);
  double seconds = -1;
  absl::StatusOr<const CompiledStridedElementwise*> again =
      Kernels().GetStrided(program, DType::kFloat32, spec, arch_, &seconds);
  ASSERT_OK(again);
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(seconds, 0);
}

// Layouts that do not match the kernel's specialisation are refused, not misread.
TEST_F(CudaStridedTest, LaunchArgumentErrors) {
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  const StridedSpecialization spec{2, {RowStep::kUnit, RowStep::kBroadcast}, RowStep::kUnit};
  absl::StatusOr<const CompiledStridedElementwise*> k =
      Kernels().GetStrided(program, DType::kFloat32, spec, arch_, nullptr);
  ASSERT_OK(k);
  DeviceBuffer a(64), b(64), out(64);
  StridedArray x{a.data(), 0, {4, 1}};
  StridedArray column{b.data(), 0, {1, 0}};
  StridedArray row{b.data(), 0, {0, 1}};
  StridedArray y{out.data(), 0, {4, 1}};
  // Rows of 3 are not whole packs of 4, so no layout here is the rows kernel's.
  const std::vector<int64_t> shape = {4, 3};
  const std::vector<StridedArray> good = {x, column};
  const std::vector<StridedArray> other = {x, row};
  EXPECT_OK(LaunchElementwiseStrided(**k, program, good, y, shape, sm_count_, stream_));
  absl::Status wrong = LaunchElementwiseStrided(**k, program, other, y, shape, sm_count_, stream_);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.message(),
            "the layouts are of the strided specialisation 2d:uu>u, the kernel of 2d:ub>u");
  const std::vector<int64_t> three = {4, 4, 1};
  EXPECT_EQ(LaunchElementwiseStrided(**k, program, good, y, three, sm_count_, stream_).message(),
            "the strided kernel is for 2 axes, not 3");
  const std::vector<StridedArray> null_input = {x, StridedArray{nullptr, 0, {1, 0}}};
  EXPECT_EQ(
      LaunchElementwiseStrided(**k, program, null_input, y, shape, sm_count_, stream_).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// One-axis unit-stride views with offsets (misaligned starts) take the contiguous kernels
// in the backend; the kernel library's strided kernel gives the same.
TEST_F(CudaStridedTest, ContiguousViewsWithOffsets) {
  const Program program = MustCompile("f * g - f", Only(MixedInputs(), {"f", "g"}));
  const std::vector<int64_t> line = {100003};
  RunBoth(program, DType::kFloat32,
          {line, {{100006, 3, {1}}, {100008, 5, {1}}}, {100010, 7, {1}}});
  const Program test = MustCompile("d < l", Only(MixedInputs(), {"d", "l"}));
  RunBoth(test, DType::kBool, {line, {{100004, 1, {1}}, Dense(line)}, {100007, 4, {1}}});
}

// The backend refuses layouts it cannot run, naming what is wrong, and writes nothing.
TEST_F(CudaStridedTest, BackendRefusals) {
  Backend& backend = CudaBackendForTests();
  const Program program = MustCompile("f - g", Only(MixedInputs(), {"f", "g"}));
  absl::StatusOr<DeviceMemory> a = backend.Allocate(0, 4096);
  absl::StatusOr<DeviceMemory> b = backend.Allocate(0, 4096);
  absl::StatusOr<DeviceMemory> out = backend.Allocate(0, 4096);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(out);
  ASSERT_EQ(cudaMemset(out->data(), 0x5a, 4096), cudaSuccess);
  absl::StatusOr<std::unique_ptr<Stream>> stream = backend.CreateStream(0);
  ASSERT_OK(stream);

  // Nine axes that do not merge (each array's strides differ in ratio).
  const std::vector<int64_t> nine(9, 2);
  const std::vector<int64_t> dense = {256, 128, 64, 32, 16, 8, 4, 2, 1};
  const std::vector<int64_t> reversed = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<StridedInput> inputs = {{&*a, {nine, dense, 0}}, {&*b, {nine, reversed, 0}}};
  absl::StatusOr<LaunchInfo> refused = backend.ElementwiseStrided(
      **stream, program, inputs, *out, {nine, dense, 0}, DType::kFloat32);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "the strided elementwise operation has 9 axes after merging those that allow it; "
            "the CUDA backend handles at most 8");

  // An input of another shape than the operation's.
  inputs = {{&*a, {{4, 4}, {4, 1}, 0}}, {&*b, {{4, 1}, {1, 0}, 0}}};
  refused = backend.ElementwiseStrided(**stream, program, inputs, *out, {{4, 4}, {4, 1}, 0},
                                       DType::kFloat32);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "an array's layout has shape (4, 1) and 2 strides; the operation's shape is (4, 4)");

  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> bytes(4096);
  ASSERT_EQ(cudaMemcpy(bytes.data(), out->data(), bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x5a), 4096);
}

}  // namespace
}  // namespace gpucompute::cuda
