// End-to-end tests of Submit's random fills: every distribution, dtype and normal
// transform against the Philox4x32-10 definition in kernels/philox.h, element by element,
// continuation at next_offset, v1 for requests that name no transform, and rejected
// requests that change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

// Element i of a fill, computed on its own from the definition in kernels/philox.h: block
// q = offset + i / k of Philox4x32-10 keyed by the seed, lane i % k, and the per-word
// transforms.
template <typename T>
T ReferenceRandom(const RandomParams& p, uint64_t i) {
  constexpr DType kDType = DTypeOf<T>::value;
  const int k = ElementsPerCounter(p.distribution, kDType);
  const PhiloxWords b = PhiloxBlock(p.seed, p.offset + i / static_cast<uint64_t>(k));
  const int lane = static_cast<int>(i % static_cast<uint64_t>(k));
  const bool v3 = p.normal_transform == NormalTransform::kInverseCdfV3;
  // Float64 v3 is v2's values.
  const bool v2 = p.normal_transform == NormalTransform::kBoxMullerV2 ||
                  (v3 && std::is_same_v<T, double>);
  if constexpr (std::is_same_v<T, float>) {
    if (p.distribution == Distribution::kUniform) return UniformFloat32(b.w[lane]);
    if (v3) {  // a word a lane (tests/cpu/normal_v3_test.cc holds the transform to the CDF)
      return std::fma(static_cast<float>(p.stddev), NormalFloat32V3(b.w[lane]),
                      static_cast<float>(p.mean));
    }
    if (v2) {
      float v[2];
      NormalPairFloat32V2(b.w[lane & 2], b.w[(lane & 2) + 1], static_cast<float>(p.mean),
                          static_cast<float>(p.stddev), &v[0], &v[1]);
      return v[lane & 1];
    }
    float z[4];
    BoxMullerFloat32(b.w[0], b.w[1], &z[0], &z[1]);
    BoxMullerFloat32(b.w[2], b.w[3], &z[2], &z[3]);
    return static_cast<float>(p.mean) + static_cast<float>(p.stddev) * z[lane];
  } else if constexpr (std::is_same_v<T, double>) {
    if (p.distribution == Distribution::kUniform)
      return UniformFloat64(b.w[2 * lane], b.w[2 * lane + 1]);
    if (v2) {
      double v[2];
      NormalPairFloat64V2(b, p.mean, p.stddev, &v[0], &v[1]);
      return v[lane];
    }
    double z[2];
    BoxMullerFloat64(b, &z[0], &z[1]);
    return p.mean + p.stddev * z[lane];
  } else {
    return static_cast<T>(
        IntegerInRange(b.w[2 * lane], b.w[2 * lane + 1], p.low, IntegerRange(p.low, p.high)));
  }
}

Distribution ToDistribution(v1::Distribution d) {
  switch (d) {
    case v1::DISTRIBUTION_NORMAL:
      return Distribution::kNormal;
    case v1::DISTRIBUTION_INTEGERS:
      return Distribution::kIntegers;
    default:
      return Distribution::kUniform;
  }
}

v1::SubmitRequest RandomRequest(v1::Distribution dist, uint64_t n, v1::DType dtype,
                                const RandomParams& p, bool set_stddev = true) {
  v1::SubmitRequest r = Random(dist, {n}, dtype, p.seed);
  v1::RandomOp* op = r.mutable_random();
  op->set_offset(p.offset);
  op->set_mean(p.mean);
  if (set_stddev) op->set_stddev(p.stddev);
  op->set_low(p.low);
  op->set_high(p.high);
  if (dist == v1::DISTRIBUTION_NORMAL) {
    op->set_normal_transform(static_cast<v1::NormalTransform>(p.normal_transform));
  }
  return r;
}

template <typename T>
void CheckRandomFill(Client& client, v1::Distribution dist, const RandomParams& p, uint64_t n,
                     bool set_stddev = true) {
  constexpr v1::DType dtype = ProtoDType<T>();
  const v1::SubmitRequest request = RandomRequest(dist, n, dtype, p, set_stddev);
  ASSIGN_OR_FAIL(auto op, RunOp(client, request));
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RANDOM);
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).dtype(), dtype);
  EXPECT_EQ(op.outputs(0).size_bytes(), n * sizeof(T));
  const uint64_t counters =
      CountersUsed(ToDistribution(dist), DTypeOf<T>::value, static_cast<int64_t>(n));
  EXPECT_EQ(counters, (n + ElementsPerCounter(ToDistribution(dist), DTypeOf<T>::value) - 1) /
                          ElementsPerCounter(ToDistribution(dist), DTypeOf<T>::value));
  EXPECT_EQ(op.next_offset(), p.offset + counters);
  ASSIGN_OR_FAIL(auto bytes1, DownloadBytes(client, op.outputs(0).id()));

  // The same request again: the same bytes.
  ASSIGN_OR_FAIL(auto op2, RunOp(client, request));
  EXPECT_EQ(op2.next_offset(), op.next_offset());
  ASSIGN_OR_FAIL(auto bytes2, DownloadBytes(client, op2.outputs(0).id()));
  EXPECT_TRUE(bytes1 == bytes2) << "the same random request gave different bytes";

  ASSERT_EQ(bytes1.size(), n * sizeof(T));
  std::vector<T> got(n);
  std::memcpy(got.data(), bytes1.data(), bytes1.size());
  int misses = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const T want = ReferenceRandom<T>(p, i);
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      if (dist == v1::DISTRIBUTION_NORMAL && p.normal_transform == NormalTransform::kBoxMullerV1) {
        // Box-Muller v1 goes through log/sqrt/cos/sin, whose last bit may differ between
        // builds (see philox.h): a few ulp of the scale. v2 and v3 are bit-exact, like
        // uniforms.
        const double ulp = std::is_same_v<T, float> ? 0x1.0p-23 : 0x1.0p-52;
        const double scale = std::max(std::fabs(static_cast<double>(want)), p.stddev);
        ok = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want)) <= 8 * ulp * scale;
      } else {
        ok = std::memcmp(&got[i], &want, sizeof(T)) == 0;  // bit-exact
      }
    } else {
      ok = got[i] == want;  // bit-exact
    }
    if (!ok && misses++ < 5)
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want;
    if constexpr (std::is_integral_v<T>) {
      if (!(got[i] >= p.low && static_cast<int64_t>(got[i]) < p.high - 0) && misses++ < 5) {
        ADD_FAILURE() << "element " << i << " = " << got[i] << " outside [" << p.low << ", "
                      << p.high << ")";
      }
    } else if (dist == v1::DISTRIBUTION_UNIFORM) {
      if (!(got[i] >= 0 && got[i] < 1) && misses++ < 5)
        ADD_FAILURE() << "element " << i << " = " << got[i];
    }
  }
  EXPECT_EQ(misses, 0);
  // A loose statistical sanity check on top of the exact comparison.
  if constexpr (std::is_floating_point_v<T>) {
    double sum = 0, sum2 = 0;
    for (T v : got) {
      sum += v;
      sum2 += static_cast<double>(v) * v;
    }
    const double mean = sum / n, var = sum2 / n - mean * mean;
    if (dist == v1::DISTRIBUTION_UNIFORM) {
      EXPECT_NEAR(mean, 0.5, 0.02);
      EXPECT_NEAR(var, 1.0 / 12, 0.01);
    } else {
      EXPECT_NEAR(mean, p.mean, 0.05 * p.stddev);
      EXPECT_NEAR(std::sqrt(var), p.stddev, 0.05 * p.stddev);
    }
  }
}

TEST_F(ServerOpsTest, RandomMatchesPhiloxDefinition) {
  constexpr uint64_t n = 10007;  // not a multiple of 2 or 4
  RandomParams p;
  p.seed = 0x0123456789abcdefULL;      // both key words non-zero
  p.offset = (uint64_t{1} << 33) + 5;  // the counter's high word non-zero
  {
    SCOPED_TRACE("uniform float32");
    p.distribution = Distribution::kUniform;
    CheckRandomFill<float>(c(), v1::DISTRIBUTION_UNIFORM, p, n);
  }
  {
    SCOPED_TRACE("uniform float64");
    CheckRandomFill<double>(c(), v1::DISTRIBUTION_UNIFORM, p, n);
  }
  for (NormalTransform transform : {NormalTransform::kBoxMullerV1, NormalTransform::kBoxMullerV2,
                                    NormalTransform::kInverseCdfV3}) {
    SCOPED_TRACE(absl::StrCat("normal transform v", static_cast<int>(transform)));
    p.normal_transform = transform;
    {
      SCOPED_TRACE("normal float32");
      p.distribution = Distribution::kNormal;
      p.mean = 3;
      p.stddev = 0.5;
      CheckRandomFill<float>(c(), v1::DISTRIBUTION_NORMAL, p, n);
    }
    {
      SCOPED_TRACE("normal float64");
      CheckRandomFill<double>(c(), v1::DISTRIBUTION_NORMAL, p, n);
    }
    {
      SCOPED_TRACE("normal float64, stddev left unset (1)");
      p.mean = -1;
      p.stddev = 1;
      CheckRandomFill<double>(c(), v1::DISTRIBUTION_NORMAL, p, n, /*set_stddev=*/false);
    }
  }
  p.normal_transform = NormalTransform::kBoxMullerV1;
  p.distribution = Distribution::kIntegers;
  p.mean = 0;
  for (auto [low, high] : std::vector<std::pair<int64_t, int64_t>>{
           {-5, 17},
           {0, 1},
           {std::numeric_limits<int32_t>::min(),
            int64_t{std::numeric_limits<int32_t>::max()} + 1}}) {
    SCOPED_TRACE(absl::StrCat("int32 integers in [", low, ", ", high, ")"));
    p.low = low;
    p.high = high;
    CheckRandomFill<int32_t>(c(), v1::DISTRIBUTION_INTEGERS, p, n);
  }
  for (auto [low, high] : std::vector<std::pair<int64_t, int64_t>>{
           {-1000, 1000},
           {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()},
           {std::numeric_limits<int64_t>::max() - 3, std::numeric_limits<int64_t>::max()}}) {
    SCOPED_TRACE(absl::StrCat("int64 integers in [", low, ", ", high, ")"));
    p.low = low;
    p.high = high;
    CheckRandomFill<int64_t>(c(), v1::DISTRIBUTION_INTEGERS, p, n);
  }
  // A small range is covered entirely.
  p.low = -5;
  p.high = 17;
  ASSIGN_OR_FAIL(auto small,
                 RunOp(c(), RandomRequest(v1::DISTRIBUTION_INTEGERS, n, v1::DTYPE_INT32, p)));
  ASSIGN_OR_FAIL(auto values, DownloadArray<int32_t>(c(), small.outputs(0).id()));
  std::map<int32_t, int> histogram;
  for (int32_t v : values) ++histogram[v];
  EXPECT_EQ(histogram.size(), 22u);
}

// A request that leaves normal_transform unset (every request from before the field)
// gets v1's numbers, bit for bit the same as one naming v1; the C++ client asks for v2.
TEST_F(ServerOpsTest, RandomNormalTransformUnsetIsV1) {
  EXPECT_EQ(Random(v1::DISTRIBUTION_NORMAL, {4}, v1::DTYPE_FLOAT32, 1).random().normal_transform(),
            v1::NORMAL_TRANSFORM_V2);
  EXPECT_EQ(Random(v1::DISTRIBUTION_UNIFORM, {4}, v1::DTYPE_FLOAT32, 1).random().normal_transform(),
            v1::NORMAL_TRANSFORM_UNSPECIFIED);
  constexpr uint64_t n = 1001;
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.seed = 99;
  p.offset = 12;
  p.mean = 1;
  p.stddev = 3;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    v1::SubmitRequest unset = RandomRequest(v1::DISTRIBUTION_NORMAL, n, dtype, p);
    unset.mutable_random()->clear_normal_transform();
    v1::SubmitRequest named_v1 = unset;
    named_v1.mutable_random()->set_normal_transform(v1::NORMAL_TRANSFORM_V1);
    v1::SubmitRequest named_v2 = unset;
    named_v2.mutable_random()->set_normal_transform(v1::NORMAL_TRANSFORM_V2);
    ASSIGN_OR_FAIL(auto op_unset, RunOp(c(), unset));
    ASSIGN_OR_FAIL(auto op_v1, RunOp(c(), named_v1));
    ASSIGN_OR_FAIL(auto op_v2, RunOp(c(), named_v2));
    // The same counters whichever the transform.
    EXPECT_EQ(op_unset.next_offset(), op_v2.next_offset());
    ASSIGN_OR_FAIL(auto bytes_unset, DownloadBytes(c(), op_unset.outputs(0).id()));
    ASSIGN_OR_FAIL(auto bytes_v1, DownloadBytes(c(), op_v1.outputs(0).id()));
    ASSIGN_OR_FAIL(auto bytes_v2, DownloadBytes(c(), op_v2.outputs(0).id()));
    EXPECT_TRUE(bytes_unset == bytes_v1) << "an unset transform is not v1";
    EXPECT_FALSE(bytes_unset == bytes_v2) << "v1 and v2 gave the same numbers";
    // And v1 is the definition's v1: the first element, from BoxMuller*.
    if (dtype == v1::DTYPE_FLOAT64) {
      double first;
      std::memcpy(&first, bytes_unset.data(), sizeof(first));
      EXPECT_NEAR(first, ReferenceRandom<double>(p, 0), 1e-12);
    }
  }
}

TEST_F(ServerOpsTest, RandomContinuesAtNextOffset) {
  RandomParams p;
  p.seed = 77;
  p.offset = 1000;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_INT64}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const v1::Distribution dist =
        dtype == v1::DTYPE_FLOAT32 ? v1::DISTRIBUTION_UNIFORM : v1::DISTRIBUTION_INTEGERS;
    p.low = -50;
    p.high = 50;
    const Distribution d = ToDistribution(dist);
    const DType dt = dtype == v1::DTYPE_FLOAT32 ? DType::kFloat32 : DType::kInt64;
    const uint64_t k = static_cast<uint64_t>(ElementsPerCounter(d, dt));
    const size_t itemsize = 4 + 4 * (dtype == v1::DTYPE_INT64);
    for (uint64_t n1 :
         {uint64_t{4096}, uint64_t{4097}, uint64_t{4099}}) {  // a multiple of k, and not
      SCOPED_TRACE(absl::StrCat("first fill of ", n1));
      constexpr uint64_t n2 = 3001;
      ASSIGN_OR_FAIL(auto first, RunOp(c(), RandomRequest(dist, n1, dtype, p)));
      const uint64_t used = CountersUsed(d, dt, static_cast<int64_t>(n1));
      ASSERT_EQ(first.next_offset(), p.offset + used);
      RandomParams p2 = p;
      p2.offset = first.next_offset();
      ASSIGN_OR_FAIL(auto second, RunOp(c(), RandomRequest(dist, n2, dtype, p2)));
      EXPECT_EQ(second.next_offset(), p2.offset + CountersUsed(d, dt, static_cast<int64_t>(n2)));
      // One fill covering both: the first fill is its head, the second its tail from
      // element used * k (the lanes of the first fill's last block that it left unused are
      // skipped, since counters are never reused).
      const uint64_t total = used * k + n2;
      ASSIGN_OR_FAIL(auto whole, RunOp(c(), RandomRequest(dist, total, dtype, p)));
      EXPECT_EQ(whole.next_offset(), second.next_offset());
      ASSIGN_OR_FAIL(auto b1, DownloadBytes(c(), first.outputs(0).id()));
      ASSIGN_OR_FAIL(auto b2, DownloadBytes(c(), second.outputs(0).id()));
      ASSIGN_OR_FAIL(auto bw, DownloadBytes(c(), whole.outputs(0).id()));
      ASSERT_EQ(bw.size(), total * itemsize);
      EXPECT_TRUE(bw.compare(0, b1.size(), b1) == 0)
          << "the first fill is not the head of the whole";
      EXPECT_TRUE(bw.compare(used * k * itemsize, b2.size(), b2) == 0)
          << "the continued fill is not the tail of the whole";
    }
  }
  // A fill into an existing buffer takes its shape and dtype and equals a fill of a new one.
  ASSIGN_OR_FAIL(auto target, UploadArray(c(), std::vector<double>(999, -1.0)));
  v1::SubmitRequest into =
      Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_UNSPECIFIED, 5, ExistingOutput(target.id()));
  const Snapshot before = TakeSnapshot(c());
  ASSIGN_OR_FAIL(auto op, RunOp(c(), into));
  EXPECT_EQ(op.outputs(0).id(), target.id());
  EXPECT_EQ(op.next_offset(), 500u);
  EXPECT_EQ(TakeSnapshot(c()), before);
  ASSIGN_OR_FAIL(auto got, DownloadArray<double>(c(), target.id()));
  RandomParams q;
  q.seed = 5;
  ASSERT_EQ(got.size(), 999u);
  for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ReferenceRandom<double>(q, i)) << i;
}

TEST_F(ServerOpsTest, RandomRejectionsChangeNothing) {
  ASSIGN_OR_FAIL(auto i32, UploadArray(c(), std::vector<int32_t>(64, 9)));
  ASSIGN_OR_FAIL(auto f64, UploadArray(c(), std::vector<double>(64, 9.0)));
  const std::vector<std::string> watched = {i32.id(), f64.id()};
  RandomParams p;
  p.seed = 1;
  const auto reject = [&](const char* what, const v1::SubmitRequest& r) {
    SCOPED_TRACE(what);
    ExpectRejected(c(), r, absl::StatusCode::kInvalidArgument, "", watched);
  };
  p.low = 5;
  p.high = 5;
  reject("low == high", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT64, p));
  p.high = 4;
  reject("low > high", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT32, p));
  p.low = 0;
  p.high = (int64_t{1} << 31) + 1;
  reject("int32 range overflow (high)",
         RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT32, p));
  p.low = int64_t{std::numeric_limits<int32_t>::min()} - 1;
  p.high = 0;
  reject("int32 range overflow (low)",
         RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT32, p));
  p.low = 0;
  p.high = 10;
  reject("uniform into a new int32",
         RandomRequest(v1::DISTRIBUTION_UNIFORM, 10, v1::DTYPE_INT32, p));
  reject("uniform into an existing int32",
         Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(i32.id())));
  reject("normal into a new int64", RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_INT64, p));
  reject("uniform into bool", RandomRequest(v1::DISTRIBUTION_UNIFORM, 10, v1::DTYPE_BOOL, p));
  reject("integers into a new float64",
         RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_FLOAT64, p));
  v1::SubmitRequest into_f64 =
      Random(v1::DISTRIBUTION_INTEGERS, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(f64.id()));
  into_f64.mutable_random()->set_low(0);
  into_f64.mutable_random()->set_high(10);
  reject("integers into an existing float64", into_f64);
  p.stddev = -1;
  reject("normal with negative stddev",
         RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_FLOAT64, p));
  reject("normal with negative stddev into an existing buffer", [&] {
    v1::SubmitRequest r =
        Random(v1::DISTRIBUTION_NORMAL, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(f64.id()));
    r.mutable_random()->set_stddev(-0.5);
    return r;
  }());
  p.stddev = 1;
  p.mean = std::nan("");
  reject("normal with NaN mean", RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_FLOAT32, p));
  p.mean = 0;
  reject("normal with an unknown transform", [&] {
    v1::SubmitRequest r = RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_FLOAT32, p);
    r.mutable_random()->set_normal_transform(static_cast<v1::NormalTransform>(4));
    return r;
  }());
  reject("no distribution", RandomRequest(v1::DISTRIBUTION_UNSPECIFIED, 10, v1::DTYPE_FLOAT32, p));
  reject("a new buffer without dtype",
         RandomRequest(v1::DISTRIBUTION_UNIFORM, 10, v1::DTYPE_UNSPECIFIED, p));
  reject(
      "shape differing from the existing output",
      Random(v1::DISTRIBUTION_UNIFORM, {65}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(f64.id())));
  p.offset = std::numeric_limits<uint64_t>::max() - 2;
  reject("counter overflow", RandomRequest(v1::DISTRIBUTION_UNIFORM, 100, v1::DTYPE_FLOAT64, p));
  {
    SCOPED_TRACE("unknown output");
    ExpectRejected(
        c(), Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput("nope")),
        absl::StatusCode::kNotFound, "", watched);
  }
}

}  // namespace
}  // namespace gpucompute::testing
