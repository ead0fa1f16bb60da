#include "common/wire_format.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <google/protobuf/io/coded_stream.h>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace gpucompute::wire {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Field numbers, as in gpucompute.proto.
constexpr uint32_t kUploadHeaderField = 1;
constexpr uint32_t kUploadChunkField = 2;
constexpr uint32_t kUploadCrcField = 3;
constexpr uint32_t kDownloadBufferField = 1;
constexpr uint32_t kDownloadOffsetField = 2;
constexpr uint32_t kDownloadDataField = 3;
constexpr uint32_t kDownloadTransferField = 4;
constexpr uint32_t kDownloadCrcField = 5;

// Reads bytes in order across a message's slices.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool AtEnd() const { return index_ == slices_.size(); }

  bool ReadByte(uint8_t* byte) {
    if (AtEnd()) return false;
    *byte = slices_[index_].begin()[position_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= uint64_t{byte & 0x7Fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  bool ReadFixed(int bytes, uint64_t* value) {
    *value = 0;
    for (int i = 0; i < bytes; ++i) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= uint64_t{byte} << (8 * i);
    }
    return true;
  }

  // The next `n` bytes as views into the slices.
  bool Take(uint64_t n, Pieces* out) {
    out->views.clear();
    out->size = n;
    while (n > 0) {
      if (AtEnd()) return false;
      const grpc::Slice& s = slices_[index_];
      const uint64_t here = std::min<uint64_t>(n, s.size() - position_);
      out->views.emplace_back(reinterpret_cast<const char*>(s.begin()) + position_, here);
      Advance(here);
      n -= here;
    }
    return true;
  }

 private:
  void Advance(uint64_t n) {
    position_ += n;
    if (position_ == slices_[index_].size()) {
      ++index_;
      position_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  uint64_t position_ = 0;
};

struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t value = 0;  // varint and fixed fields
  Pieces bytes;        // length-delimited fields
};

// Calls `fn` for each field of the message in `slices`, in wire order.
absl::Status ScanFields(const std::vector<grpc::Slice>& slices, const char* type,
                        absl::FunctionRef<absl::Status(const Field&)> fn) {
  SliceCursor cursor(slices);
  Field field;
  while (!cursor.AtEnd()) {
    uint64_t tag;
    bool ok = cursor.ReadVarint(&tag);
    field.number = static_cast<uint32_t>(tag >> 3);
    field.wire_type = static_cast<uint32_t>(tag & 7);
    if (ok && field.number == 0) ok = false;
    if (ok) {
      switch (field.wire_type) {
        case kVarint:
          ok = cursor.ReadVarint(&field.value);
          break;
        case kFixed64:
          ok = cursor.ReadFixed(8, &field.value);
          break;
        case kFixed32:
          ok = cursor.ReadFixed(4, &field.value);
          break;
        case kLengthDelimited: {
          uint64_t length;
          ok = cursor.ReadVarint(&length) && cursor.Take(length, &field.bytes);
          break;
        }
        default:
          ok = false;  // groups are not used by this API
      }
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("a malformed ", type, " message"));
    if (absl::Status s = fn(field); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParseEmbedded(const Field& field, const char* name,
                           google::protobuf::MessageLite* message) {
  if (field.wire_type != kLengthDelimited) {
    return absl::InvalidArgumentError(absl::StrCat("field '", name, "' has the wrong wire type"));
  }
  std::string bytes;
  bytes.resize(field.bytes.size);
  field.bytes.CopyTo(bytes.data());
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("field '", name, "' does not parse"));
  }
  return absl::OkStatus();
}

absl::Status Malformed(const google::protobuf::MessageLite& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("a malformed ", message.GetTypeName(), " message"));
}

absl::Status CheckWireType(const Field& field, uint32_t wire_type, const char* name) {
  if (field.wire_type == wire_type) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("field '", name, "' has the wrong wire type"));
}

void AppendTag(uint32_t field, uint32_t wire_type, std::string* out) {
  AppendVarint(uint64_t{field} << 3 | wire_type, out);
}

void AppendFixed32(uint32_t field, uint32_t value, std::string* out) {
  AppendTag(field, kFixed32, out);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

void AppendEmbedded(uint32_t field, const google::protobuf::MessageLite& message,
                    std::string* out) {
  AppendTag(field, kLengthDelimited, out);
  AppendVarint(message.ByteSizeLong(), out);
  message.AppendToString(out);
}

// `prefix` (the fields before the bytes and the bytes' own tag and length), then `data`.
grpc::ByteBuffer WithData(std::string prefix, const grpc::Slice& data) {
  const grpc::Slice slices[2] = {grpc::Slice(prefix), data};
  return grpc::ByteBuffer(slices, data.size() == 0 ? 1 : 2);
}

}  // namespace

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void BeginEmbedded(uint32_t field, uint64_t length, std::string* out) {
  AppendTag(field, kLengthDelimited, out);
  AppendVarint(length, out);
}

size_t EmbeddedHeaderSize(uint32_t field, uint64_t length) {
  using google::protobuf::io::CodedOutputStream;
  return CodedOutputStream::VarintSize64(uint64_t{field} << 3 | kLengthDelimited) +
         CodedOutputStream::VarintSize64(length);
}

void Pieces::CopyTo(void* dst) const {
  char* out = static_cast<char*>(dst);
  for (std::string_view v : views) {
    std::memcpy(out, v.data(), v.size());
    out += v.size();
  }
}

uint32_t Pieces::Crc32c() const {
  uint32_t crc = 0;
  for (std::string_view v : views) crc = ExtendCrc32c(crc, v.data(), v.size());
  return crc;
}

absl::Status ParseUploadRequest(const grpc::ByteBuffer& buffer, UploadMessage* out) {
  out->slices.clear();
  out->kind = UploadMessage::Kind::kEmpty;
  out->chunk = Pieces();
  out->chunk_crc32c.reset();
  if (!buffer.Dump(&out->slices).ok()) return absl::InvalidArgumentError("an unreadable message");
  return ScanFields(out->slices, "UploadRequest", [out](const Field& f) -> absl::Status {
    switch (f.number) {
      case kUploadHeaderField:
      case kUploadChunkField:
        if (out->kind != UploadMessage::Kind::kEmpty) {
          return absl::InvalidArgumentError(
              "an upload message carries more than one of 'header' and 'chunk'");
        }
        if (f.number == kUploadHeaderField) {
          out->kind = UploadMessage::Kind::kHeader;
          return ParseEmbedded(f, "header", &out->header);
        }
        out->kind = UploadMessage::Kind::kChunk;
        out->chunk = f.bytes;
        return CheckWireType(f, kLengthDelimited, "chunk");
      case kUploadCrcField:
        out->chunk_crc32c = static_cast<uint32_t>(f.value);
        return CheckWireType(f, kFixed32, "chunk_crc32c");
      default:
        return absl::OkStatus();  // a field of a newer client: ignored, as protobuf would
    }
  });
}

absl::Status ParseDownloadResponse(const grpc::ByteBuffer& buffer, DownloadMessage* out) {
  out->slices.clear();
  out->has_buffer = false;
  out->offset_bytes = 0;
  out->data = Pieces();
  out->has_transfer = false;
  out->data_crc32c.reset();
  if (!buffer.Dump(&out->slices).ok()) return absl::InvalidArgumentError("an unreadable message");
  return ScanFields(out->slices, "DownloadResponse", [out](const Field& f) -> absl::Status {
    switch (f.number) {
      case kDownloadBufferField:
        out->has_buffer = true;
        return ParseEmbedded(f, "buffer", &out->buffer);
      case kDownloadOffsetField:
        out->offset_bytes = f.value;
        return CheckWireType(f, kVarint, "offset_bytes");
      case kDownloadDataField:
        out->data = f.bytes;
        return CheckWireType(f, kLengthDelimited, "data");
      case kDownloadTransferField:
        out->has_transfer = true;
        return ParseEmbedded(f, "transfer", &out->transfer);
      case kDownloadCrcField:
        out->data_crc32c = static_cast<uint32_t>(f.value);
        return CheckWireType(f, kFixed32, "data_crc32c");
      default:
        return absl::OkStatus();
    }
  });
}

grpc::ByteBuffer UploadChunk(const grpc::Slice& data, std::optional<uint32_t> crc32c) {
  std::string prefix;
  if (crc32c.has_value()) AppendFixed32(kUploadCrcField, *crc32c, &prefix);
  AppendTag(kUploadChunkField, kLengthDelimited, &prefix);
  AppendVarint(data.size(), &prefix);
  return WithData(std::move(prefix), data);
}

grpc::ByteBuffer DownloadChunk(const v1::BufferInfo* buffer, uint64_t offset_bytes,
                               const v1::TransferStats* transfer, std::optional<uint32_t> crc32c,
                               const grpc::Slice& data) {
  std::string prefix;
  if (buffer != nullptr) AppendEmbedded(kDownloadBufferField, *buffer, &prefix);
  if (offset_bytes != 0) {
    AppendTag(kDownloadOffsetField, kVarint, &prefix);
    AppendVarint(offset_bytes, &prefix);
  }
  if (transfer != nullptr) AppendEmbedded(kDownloadTransferField, *transfer, &prefix);
  if (crc32c.has_value()) AppendFixed32(kDownloadCrcField, *crc32c, &prefix);
  if (data.size() != 0) {
    AppendTag(kDownloadDataField, kLengthDelimited, &prefix);
    AppendVarint(data.size(), &prefix);
  }
  return WithData(std::move(prefix), data);
}

grpc::ByteBuffer Serialize(const google::protobuf::MessageLite& message) {
  return FromBytes(message.SerializeAsString());
}

grpc::ByteBuffer FromBytes(std::string bytes) {
  // Small ones are copied: cheaper than a string of their own on the heap.
  if (bytes.size() <= 256) {
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  }
  auto* owned = new std::string(std::move(bytes));
  grpc::Slice slice(
      owned->data(), owned->size(), [](void* p) { delete static_cast<std::string*>(p); }, owned);
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status Parse(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) return Malformed(*message);
  return Parse(std::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size()),
               message);
}

absl::Status Parse(std::string_view bytes, google::protobuf::MessageLite* message) {
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Malformed(*message);
  }
  return absl::OkStatus();
}

}  // namespace gpucompute::wire
