// gpucompute-grpc-ceiling: what one gRPC stream itself moves over loopback, with nothing
// of gpucompute on either side, as the ceiling for the service's one-stream rows.
//
// An in-process server with a generic callback service, and a client on the synchronous
// API, as the library's transfers use them: an upload is a client stream of messages whose
// slices point into the client's array, which the server reads and drops; a download is a
// server stream of slices over one prepared block, which the client reads and drops. So
// each way carries the messages and nothing else: no staging copy, no device copy, and no
// copy into the client's array, which the service's rows do on top.
//
//   gpucompute-grpc-ceiling [--mib=512] [--chunk-kib=1024,4096] [--repeat=5]
//
// Prints, per message size, the median wall time and GB/s of each way.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/transfer_memory.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kSinkMethod[] = "/ceiling.Bench/Sink";      // client stream, dropped
constexpr char kSourceMethod[] = "/ceiling.Bench/Source";  // server stream of `bytes`

// The source's request: the bytes to send and the message size, as two decimal numbers.
std::string SourceRequest(uint64_t bytes, uint64_t chunk) {
  return absl::StrCat(bytes, " ", chunk);
}

// Reads every message of a Sink call and answers with an empty message; for a Source
// call, reads its request and streams slices over `block` until the bytes are sent.
class Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(grpc::GenericCallbackServerContext* context, const std::string& block)
      : source_(context->method() == kSourceMethod), block_(block) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!source_) {
      if (ok) {
        in_.Clear();
        StartRead(&in_);
        return;
      }
      grpc::Slice empty;  // a valid message of no bytes (a default ByteBuffer is none)
      out_ = grpc::ByteBuffer(&empty, 1);
      StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
    std::vector<grpc::Slice> slices;
    std::string text;
    if (in_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices)
        text.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    std::vector<std::string> parts = absl::StrSplit(text, ' ');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &left_) ||
        !absl::SimpleAtoi(parts[1], &chunk_) || chunk_ == 0 || chunk_ > block_.size()) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad request"));
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    if (source_) WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (left_ == 0) return Finish(grpc::Status::OK);
    const uint64_t n = std::min(left_, chunk_);
    left_ -= n;
    grpc::Slice slice(block_.data(), static_cast<size_t>(n), grpc::Slice::STATIC_SLICE);
    out_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&out_);
  }

  const bool source_;
  const std::string& block_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  uint64_t left_ = 0;
  uint64_t chunk_ = 0;
};

class Service final : public grpc::CallbackGenericService {
 public:
  explicit Service(uint64_t max_chunk) : block_(max_chunk, 'x') {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new Reactor(context, block_);
  }

 private:
  const std::string block_;
};

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One upload of `data` in `chunk`-byte messages; false if the call failed.
bool Upload(grpc::Channel& channel, const std::string& data, uint64_t chunk) {
  grpc::ClientContext context;
  grpc::ByteBuffer response;
  const grpc::internal::RpcMethod method(kSinkMethod, grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(&channel, method, &context,
                                                                    &response));
  for (uint64_t sent = 0; sent < data.size();) {
    const uint64_t n = std::min<uint64_t>(chunk, data.size() - sent);
    grpc::Slice slice(data.data() + sent, static_cast<size_t>(n), grpc::Slice::STATIC_SLICE);
    grpc::ByteBuffer message(&slice, 1);
    if (!writer->Write(message)) break;
    sent += n;
  }
  writer->WritesDone();
  return writer->Finish().ok();
}

// One download of `bytes` in `chunk`-byte messages; false if the call failed or fell short.
bool Download(grpc::Channel& channel, uint64_t bytes, uint64_t chunk) {
  grpc::ClientContext context;
  const grpc::internal::RpcMethod method(kSourceMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING);
  const std::string text = SourceRequest(bytes, chunk);
  grpc::Slice request_slice(text);
  grpc::ByteBuffer request(&request_slice, 1);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(&channel, method, &context,
                                                                    request));
  uint64_t received = 0;
  for (grpc::ByteBuffer message; reader->Read(&message);) {
    received += message.Length();
    message.Clear();
  }
  return reader->Finish().ok() && received == bytes;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 512;
  int repeat = 5;
  std::string chunks = "1024,4096";
  CLI::App app("gpucompute-grpc-ceiling: one bare gRPC stream each way over loopback, the\n"
               "ceiling of the service's one-stream transfer rows.",
               "gpucompute-grpc-ceiling");
  app.add_option("--mib", mib, "MiB moved each way")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--chunk-kib", chunks, "message sizes in KiB, 1 to 65536, comma-separated")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "timed runs after one warm-up; the median is printed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  std::vector<uint64_t> chunks_kib;
  for (absl::string_view part : absl::StrSplit(chunks, ',')) {
    uint64_t kib = 0;
    if (!absl::SimpleAtoi(part, &kib) || kib == 0 || kib > 65536) {
      std::fprintf(stderr, "--chunk-kib: '%s' is not a size from 1 to 65536 KiB\n",
                   std::string(part).c_str());
      return 2;
    }
    chunks_kib.push_back(kib);
  }
  gpucompute::RetainTransferMemory();
  const uint64_t max_chunk = *std::max_element(chunks_kib.begin(), chunks_kib.end()) << 10;
  const int max_message = static_cast<int>(max_chunk + (1 << 20));

  Service service(max_chunk);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "gpucompute-grpc-ceiling: cannot start the server\n");
    return 1;
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxSendMessageSize(max_message);
  arguments.SetMaxReceiveMessageSize(max_message);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), arguments);

  const uint64_t bytes = mib << 20;
  const std::string data(bytes, 'a');
  std::printf("bare gRPC, one stream over loopback, %llu MiB, median of %d after one warm-up\n",
              static_cast<unsigned long long>(mib), repeat);
  std::printf("%-12s %12s %12s %14s %12s\n", "message KiB", "upload ms", "upload GB/s",
              "download ms", "download GB/s");
  for (uint64_t kib : chunks_kib) {
    const uint64_t chunk = kib << 10;
    std::vector<double> up, down;
    for (int r = 0; r <= repeat; ++r) {
      Clock::time_point start = Clock::now();
      if (!Upload(*channel, data, chunk)) {
        std::fprintf(stderr, "gpucompute-grpc-ceiling: an upload failed\n");
        return 1;
      }
      const double up_s = Seconds(start);
      start = Clock::now();
      if (!Download(*channel, bytes, chunk)) {
        std::fprintf(stderr, "gpucompute-grpc-ceiling: a download failed\n");
        return 1;
      }
      const double down_s = Seconds(start);
      if (r > 0) {
        up.push_back(up_s);
        down.push_back(down_s);
      }
    }
    const double u = Median(up), d = Median(down);
    std::printf("%-12llu %12.1f %12.2f %14.1f %12.2f\n", static_cast<unsigned long long>(kib),
                u * 1e3, bytes / u / 1e9, d * 1e3, bytes / d / 1e9);
  }
  server->Shutdown();
  return 0;
}
