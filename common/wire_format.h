// The transfer messages of gpucompute.v1 (UploadRequest, DownloadResponse) read from and
// written to gRPC byte buffers directly, so that chunk bytes never pass through a
// protobuf `bytes` field: a received chunk is a list of views into the slices gRPC
// received it in, and a sent chunk is a slice over the sender's own memory behind a few
// bytes of framing. The encoding is the ordinary protobuf wire format, so peers that use
// the generated messages (the Python client, older clients) read and write the same bytes.
// The small messages inside (UploadHeader, BufferInfo, TransferStats) are parsed and
// serialized by protobuf as usual.
#ifndef GPUCOMPUTE_COMMON_WIRE_FORMAT_H_
#define GPUCOMPUTE_COMMON_WIRE_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "gpucompute/v1/gpucompute.pb.h"

namespace gpucompute::wire {

// Bytes spread over slices, in order. The views point into slices someone keeps alive.
struct Pieces {
  std::vector<std::string_view> views;
  uint64_t size = 0;

  // Copies the bytes to `dst`, which holds at least `size`.
  void CopyTo(void* dst) const;
  uint32_t Crc32c() const;
};

// A received message: its slices (which own the bytes the views point into) and what
// was parsed from them. Reusable: Parse* clears it first.
struct UploadMessage {
  enum class Kind { kEmpty, kHeader, kChunk };
  std::vector<grpc::Slice> slices;
  Kind kind = Kind::kEmpty;
  v1::UploadHeader header;  // kHeader
  Pieces chunk;             // kChunk
  std::optional<uint32_t> chunk_crc32c;
};

struct DownloadMessage {
  std::vector<grpc::Slice> slices;
  bool has_buffer = false;
  v1::BufferInfo buffer;
  uint64_t offset_bytes = 0;
  Pieces data;
  bool has_transfer = false;
  v1::TransferStats transfer;
  std::optional<uint32_t> data_crc32c;
};

// INVALID_ARGUMENT for bytes that are not a well-formed message of the type, or an
// UploadRequest that carries both a header and a chunk.
absl::Status ParseUploadRequest(const grpc::ByteBuffer& buffer, UploadMessage* out);
absl::Status ParseDownloadResponse(const grpc::ByteBuffer& buffer, DownloadMessage* out);

// An UploadRequest whose chunk is `data`, used as it is (no copy).
grpc::ByteBuffer UploadChunk(const grpc::Slice& data, std::optional<uint32_t> crc32c);
// A DownloadResponse whose data is `data`, used as it is; `buffer` and `transfer` are
// set when not null.
grpc::ByteBuffer DownloadChunk(const v1::BufferInfo* buffer, uint64_t offset_bytes,
                               const v1::TransferStats* transfer, std::optional<uint32_t> crc32c,
                               const grpc::Slice& data);

// Any message, serialized by protobuf (headers, requests and responses of the unary
// kind). Parse gives INVALID_ARGUMENT for bytes that do not parse.
grpc::ByteBuffer Serialize(const google::protobuf::MessageLite& message);

// Bytes already encoded, as one slice that owns them (no copy).
grpc::ByteBuffer FromBytes(std::string bytes);

// Writing a message by hand, from pieces encoded once (a prepared chain's answer): a
// varint, and the tag and length of embedded message `field`, whose `length` bytes the
// caller appends next.
void AppendVarint(uint64_t value, std::string* out);
void BeginEmbedded(uint32_t field, uint64_t length, std::string* out);
// The bytes BeginEmbedded appends.
size_t EmbeddedHeaderSize(uint32_t field, uint64_t length);
absl::Status Parse(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);
absl::Status Parse(std::string_view bytes, google::protobuf::MessageLite* message);

}  // namespace gpucompute::wire

#endif  // GPUCOMPUTE_COMMON_WIRE_FORMAT_H_
