// The Backend conformance suite: one set of tests (backend_conformance_test.cc) that every
// implementation of server/core/backend.h must pass, so that the CPU backend and the CUDA
// backend are interchangeable behind the executor.
//
// The suite is a value-parameterized GoogleTest suite over BackendFactory.
// backend_conformance_test.cc holds the TEST_P bodies and one instantiation per backend:
// the CPU backend with three worker threads and with one, and the CUDA backend where the
// build has it (each of its tests skips where no GPU is usable). A new backend adds its
// own INSTANTIATE_TEST_SUITE_P there.
//
// A factory that returns nullptr means "not available here" (no GPU): every test of that
// instantiation is then skipped with GTEST_SKIP(), never failed.
//
// Everything below goes through the Backend interface only (no CPU specifics), so the
// helpers serve any backend.
#ifndef GPUCOMPUTE_TESTS_BACKEND_BACKEND_CONFORMANCE_H_
#define GPUCOMPUTE_TESTS_BACKEND_BACKEND_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/backend.h"
#include "tests/support/test_util.h"

#if defined(GPUCOMPUTE_HAVE_CUDA)
#include "server/cuda/cuda_backend.h"
#endif

namespace gpucompute::conformance {

struct BackendFactory {
  // Shown in test names: letters, digits and underscores only.
  std::string name;
  // Returns a fresh backend, or nullptr when this backend cannot run here.
  std::function<std::unique_ptr<Backend>()> create;
};

inline void PrintTo(const BackendFactory& factory, std::ostream* os) { *os << factory.name; }

// The name generator for INSTANTIATE_TEST_SUITE_P.
inline std::string BackendFactoryName(const ::testing::TestParamInfo<BackendFactory>& info) {
  return info.param.name;
}

#if defined(GPUCOMPUTE_HAVE_CUDA)
// The CUDA backend, or nullptr where no GPU is usable (every test then skips); a GPU whose
// backend does not start fails the test. No disk cache: each run compiles afresh.
inline std::unique_ptr<Backend> MaybeCreateCudaBackend() {
  if (cuda::CudaDeviceCount() == 0) return nullptr;
  cuda::CudaBackendOptions options;
  absl::StatusOr<std::unique_ptr<Backend>> backend = cuda::CreateCudaBackend(options);
  if (!backend.ok()) {
    ADD_FAILURE() << "a GPU is present but the CUDA backend did not start: " << backend.status();
    return nullptr;
  }
  return *std::move(backend);
}
#endif

// Waits until all work enqueued on `stream` so far has completed, and returns the
// stream's error state. The promise is shared with the callback so that a timeout cannot
// leave the callback writing into a dead frame. Only a hung backend takes `timeout`; the
// test then fails instead of hanging.
inline absl::Status Synchronize(Stream& stream,
                                std::chrono::seconds timeout = std::chrono::seconds(120)) {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  absl::Status enqueued =
      stream.OnComplete([done](absl::Status status) mutable { done->set_value(status); });
  if (!enqueued.ok()) return enqueued;
  if (result.wait_for(timeout) != std::future_status::ready) {
    return absl::DeadlineExceededError("stream did not complete within the timeout");
  }
  return result.get();
}

// Allocates room for host.size() + extra_elements elements of T on device 0, copies
// `host` to the start and, when `guard` is given, sets the extra elements to *guard (so a
// test can check that an operation wrote nothing past its count). Waits for the copies,
// so `host` may be freed on return. Bool arrays are passed as uint8_t.
template <typename T>
absl::StatusOr<DeviceMemory> Upload(Backend& backend, Stream& stream, std::span<const T> host,
                                    size_t extra_elements = 0, const T* guard = nullptr) {
  const uint64_t bytes = host.size_bytes();
  absl::StatusOr<DeviceMemory> mem = backend.Allocate(0, bytes + extra_elements * sizeof(T));
  if (!mem.ok()) return mem.status();
  if (bytes > 0) {
    absl::Status s = backend.CopyFromHost(stream, host.data(), *mem, 0, bytes);
    if (!s.ok()) return s;
  }
  const std::vector<T> tail(guard != nullptr ? extra_elements : 0, guard != nullptr ? *guard : T{});
  if (!tail.empty()) {
    absl::Status s =
        backend.CopyFromHost(stream, tail.data(), *mem, bytes, tail.size() * sizeof(T));
    if (!s.ok()) return s;
  }
  absl::Status s = Synchronize(stream);
  if (!s.ok()) return s;
  return mem;
}

template <typename T>
absl::StatusOr<DeviceMemory> Upload(Backend& backend, Stream& stream, const std::vector<T>& host,
                                    size_t extra_elements = 0, const T* guard = nullptr) {
  return Upload(backend, stream, std::span<const T>(host), extra_elements, guard);
}

// Copies `count` elements of T, starting `offset_bytes` into `mem`, to the host once all
// work enqueued before on `stream` has completed.
template <typename T>
absl::StatusOr<std::vector<T>> Download(Backend& backend, Stream& stream, const DeviceMemory& mem,
                                        size_t count, uint64_t offset_bytes = 0) {
  std::vector<T> host(count);
  if (count > 0) {
    absl::Status s = backend.CopyToHost(stream, mem, offset_bytes, host.data(), count * sizeof(T));
    if (!s.ok()) return s;
  }
  absl::Status s = Synchronize(stream);
  if (!s.ok()) return s;
  return host;
}

// The fixture: a backend from the factory and one stream on device 0.
class BackendConformance : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    const BackendFactory& factory = GetParam();
    if (factory.create) backend_ = factory.create();
    if (backend_ == nullptr) {
      GTEST_SKIP() << "backend " << factory.name << " is not available on this machine";
    }
    ASSERT_FALSE(backend_->devices().empty()) << "a backend must describe at least one device";
    auto stream = backend_->CreateStream(0);
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
  }

  Backend& backend() { return *backend_; }
  Stream& stream() { return *stream_; }

  // Declared before stream_ so that the stream is destroyed first.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace gpucompute::conformance

#endif  // GPUCOMPUTE_TESTS_BACKEND_BACKEND_CONFORMANCE_H_
