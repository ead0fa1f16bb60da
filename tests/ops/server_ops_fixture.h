// What the end-to-end suites of the operations (tests/server_ops_*_test.cc, one file per
// RPC family, linked into one program, server_ops_test) share: a fresh in-process server
// and client for each test, seeded test data, float64 references' tolerance checks, the
// check that a rejected request changed nothing, and chains of operations long enough to
// hold a stream busy.
//
// Inputs go up with Client::Upload, operations run through Submit, results come back with
// Download, and every value is compared with a reference computed in the test, in float64,
// from the inputs alone. GPUCOMPUTE_TEST_BACKEND=cuda runs every suite on a GPU.
#ifndef GPUCOMPUTE_TESTS_OPS_SERVER_OPS_FIXTURE_H_
#define GPUCOMPUTE_TESTS_OPS_SERVER_OPS_FIXTURE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {

// One server per test (so listings, memory and stats start from zero) and a client of it.
class ServerOpsTest : public ::testing::Test {
 protected:
  void SetUp() override;

  Client& c() { return *client_; }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

inline const std::regex kOpIdPattern("op-[0-9a-f]{32}");
inline const std::regex kStreamIdPattern("str-[0-9a-f]{32}");

// ---------------------------------------------------------------------------
// Requests

// `request` with wait set, on `stream` (empty: the client's default stream).
v1::SubmitRequest Waiting(v1::SubmitRequest request, std::string_view stream = {});
// `request` without wait, on `stream`.
v1::SubmitRequest OnStream(v1::SubmitRequest request, std::string_view stream);
// Submits with wait; an operation that did not succeed is an INTERNAL error.
absl::StatusOr<v1::Operation> RunOp(Client& client, v1::SubmitRequest request,
                                    std::string_view stream = {});

// Submits a request that must be rejected with `code` (and, when given, a message containing
// `needle`), and checks that it changed nothing: the listing, the memory use, and the bytes
// of every buffer in `watched`.
void ExpectRejected(Client& client, const v1::SubmitRequest& request, absl::StatusCode code,
                    std::string_view needle = {}, const std::vector<std::string>& watched = {});

// Operations of `kind` the server has completed (GetStats).
uint64_t CompletedCount(Client& client, v1::OperationKind kind);

// Waits until the server's memory use is `bytes` (queued work may still hold some).
void ExpectMemoryReturnsTo(Client& client, uint64_t bytes);

void ExpectContains(std::string_view text, std::string_view needle);

// An operand naming the output of the session's or chain's step `tag`.
v1::Operand Tagged(std::string_view tag);

// ---------------------------------------------------------------------------
// Test data and references

// Deterministic test data: a 64-bit LCG, uniform doubles in [lo, hi).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  double Uniform(double lo, double hi) {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * static_cast<double>(state_ >> 11) * 0x1.0p-53;
  }
  int64_t Int(int64_t lo, int64_t hi) {  // [lo, hi)
    return lo + static_cast<int64_t>(Uniform(0, 1) * static_cast<double>(hi - lo));
  }

 private:
  uint64_t state_;
};

template <typename To, typename From>
std::vector<To> Cast(const std::vector<From>& v) {
  std::vector<To> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<To>(v[i]);
  return out;
}

// A (rows x cols), logically A[i][j] = a[i * cols + j], stored in `layout`.
template <typename T>
std::vector<T> ToMemory(const std::vector<double>& a, size_t rows, size_t cols, v1::Layout layout) {
  std::vector<T> mem(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      mem[layout == v1::LAYOUT_F ? j * rows + i : i * cols + j] = static_cast<T>(a[i * cols + j]);
    }
  }
  return mem;
}

// Compares got[i] with ref[i] within rel * max(|ref[i]|, floor) and reports the first few misses.
template <typename T>
void ExpectClose(const std::vector<T>& got, const std::vector<double>& ref, double rel,
                 double floor = 0, std::string_view what = "") {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int misses = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::fabs(g - ref[i]);
    const double scale = std::max(std::fabs(ref[i]), floor);
    if (scale > 0) worst = std::max(worst, err / scale);
    if (!(err <= rel * scale) && misses++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << g << ", want " << ref[i] << " (error "
                    << err << " > " << rel * scale << ")";
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << ref.size()
                       << " elements out of tolerance; worst relative error " << worst;
}

// ---------------------------------------------------------------------------
// Chains: work that keeps a stream busy while a test submits behind it

// 1<<22 float64 elements (32 MiB): x + 1 on them takes milliseconds on the CPU backend, so
// a chain of 30 keeps a stream busy for well over 10 ms.
inline constexpr size_t kBig = size_t{1} << 22;
inline constexpr int kChain = 30;

// v[i] = (i % 65536) * scale.
std::vector<double> Iota(size_t n, double scale = 1);

// x = x + 1 in place, without waiting, in an expression slow enough that a chain of them
// outlasts the RPCs that queue it (see IncrementExpression in the .cc).
v1::SubmitRequest Increment(const std::string& buffer, std::string_view stream = {});

// Queues `count` increments of `buffer` and returns the ids.
std::vector<std::string> QueueChain(Client& client, const std::string& buffer, int count,
                                    std::string_view stream = {});

// Expects every element of `buffer` to be base[i] + delta.
void ExpectShifted(Client& client, const std::string& buffer, const std::vector<double>& base,
                   double delta, std::string_view what);

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_OPS_SERVER_OPS_FIXTURE_H_
