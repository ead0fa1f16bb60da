// A minimal program on the client library: upload once, chain operations on the
// resident array, fetch only the small result. Run against a server:
//   gpucompute-example [HOST:PORT]
#include <cstdio>
#include <numeric>
#include <vector>

#include "client/cpp/client.h"

namespace v1 = gpucompute::v1;

int main(int argc, char** argv) {
  gpucompute::ClientOptions options;
  if (argc > 1) options.target = argv[1];
  absl::StatusOr<std::unique_ptr<gpucompute::Client>> client = gpucompute::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }

  // Upload x = 0, 1, ..., n-1 once.
  const uint64_t n = 1 << 20;
  std::vector<double> values(n);
  std::iota(values.begin(), values.end(), 0.0);
  v1::UploadHeader header;
  header.mutable_create()->set_dtype(v1::DTYPE_FLOAT64);
  header.mutable_create()->add_shape(n);
  absl::StatusOr<v1::UploadResponse> x =
      (*client)->Upload(header, std::as_bytes(std::span(values)));
  if (!x.ok()) {
    std::fprintf(stderr, "upload: %s\n", x.status().ToString().c_str());
    return 1;
  }
  const std::string id = x->buffer().id();

  // y = 2x + 1 and its sum, both on the server; only the sum comes back.
  v1::SubmitRequest eval = gpucompute::Elementwise(
      "a*x + 1", {{"a", gpucompute::ScalarOperand(2.0)}, {"x", gpucompute::BufferOperand(id)}});
  eval.set_wait(true);
  absl::StatusOr<v1::Operation> y = (*client)->Submit(eval);
  if (!y.ok() || y->state() != v1::Operation::STATE_SUCCEEDED) {
    std::fprintf(stderr, "eval failed: %s\n",
                 y.ok() ? y->error_message().c_str() : y.status().ToString().c_str());
    return 1;
  }
  v1::SubmitRequest sum = gpucompute::Reduce(v1::REDUCE_KIND_SUM, y->outputs(0).id());
  sum.set_wait(true);
  absl::StatusOr<v1::Operation> total = (*client)->Submit(sum);
  if (!total.ok() || total->values_size() != 1) {
    std::fprintf(stderr, "sum failed: %s\n",
                 total.ok() ? total->error_message().c_str() : total.status().ToString().c_str());
    return 1;
  }
  std::printf("upload   %.3f GB/s\n", x->transfer().gbps());
  std::printf("a*x + 1  %.3f ms on the device, %.2f GB/s\n", y->timing().device_seconds() * 1e3,
              y->timing().gbps());
  std::printf("sum      %.17g (expected %.17g)\n", total->values(0).float_value(),
              static_cast<double>(n) * static_cast<double>(n));
  return 0;
}
