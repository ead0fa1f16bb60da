// The status assertions of every test, one spelling for absl::Status, absl::StatusOr<T>
// and grpc::Status:
//
//   ASSERT_OK(client.DeleteBuffer(id));            // or EXPECT_OK; either takes << "context"
//   ASSIGN_OR_FAIL(v1::BufferInfo info, client.GetBuffer("x"));
//   ASSIGN_OR_FAIL(auto op, client.Submit(request));
//
// ASSIGN_OR_FAIL is ASSIGN_OR_RETURN (server/util/status_macros.h) for a test: `lhs` may declare
// a variable, and an error fails the test and returns from the current function (which,
// as for every ASSERT_*, must return void). A failure message names the expression and
// its status.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_TEST_UTIL_H_
#define GPUCOMPUTE_TESTS_SUPPORT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_status.h"

namespace gpucompute::testing {

inline absl::Status StatusOf(const absl::Status& status) { return status; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
inline absl::Status StatusOf(const grpc::Status& status) { return FromGrpcStatus(status); }

// The predicate-formatter behind ASSERT_OK and EXPECT_OK.
template <typename T>
::testing::AssertionResult IsOk(const char* expression, const T& value) {
  const absl::Status status = StatusOf(value);
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expression << " is not OK: " << status;
}

// `n` values drawn uniformly from [low, high) by mt19937_64 seeded with `seed`: the same
// on every run and machine.
inline std::vector<double> RandomDoubles(size_t n, double low, double high, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(low, high);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

}  // namespace gpucompute::testing

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::gpucompute::testing::IsOk, expr)
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::gpucompute::testing::IsOk, expr)

#define GPUCOMPUTE_TEST_CONCAT_INNER_(a, b) a##b
#define GPUCOMPUTE_TEST_CONCAT_(a, b) GPUCOMPUTE_TEST_CONCAT_INNER_(a, b)
#define ASSIGN_OR_FAIL(lhs, expr) \
  GPUCOMPUTE_ASSIGN_OR_FAIL_IMPL_(GPUCOMPUTE_TEST_CONCAT_(gpucompute_test_or_, __LINE__), lhs, expr)
#define GPUCOMPUTE_ASSIGN_OR_FAIL_IMPL_(tmp, lhs, expr)             \
  auto tmp = (expr);                                                \
  ASSERT_TRUE(tmp.ok()) << #expr << " is not OK: " << tmp.status(); \
  lhs = *std::move(tmp)

#endif  // GPUCOMPUTE_TESTS_SUPPORT_TEST_UTIL_H_
