#include "server/persistence/persist_format.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "server/util/status_macros.h"

namespace gpucompute {
namespace {

void PutLittle(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetLittle(absl::string_view data, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<unsigned char>(data[offset + i])} << (8 * i);
  }
  return value;
}

bool IsBufferId(absl::string_view id) {
  if (id.size() != 36 || id.substr(0, 4) != "buf-") return false;
  for (char c : id.substr(4)) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> EncodePersistHeader(const PersistedHeader& h) {
  if (h.scope.size() > 0xffff || h.id.size() > 0xffff || h.name.size() > 0xffff ||
      h.shape.size() > kMaxDimensions || h.device < 0 || h.device > 0xff || h.ttl_nanos < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer ", h.id, " does not fit the persistence format"));
  }
  std::string out(kPersistMagic, kPersistMagicBytes);
  PutLittle(kPersistFormatVersion, 4, &out);
  const size_t length = kPersistFixedHeaderBytes + 8 * h.shape.size() + h.scope.size() +
                        h.id.size() + h.name.size() + 4;
  PutLittle(length, 4, &out);
  PutLittle(h.scope.size(), 2, &out);
  PutLittle(h.id.size(), 2, &out);
  PutLittle(h.name.size(), 2, &out);
  PutLittle(static_cast<uint8_t>(h.dtype), 1, &out);
  PutLittle(h.layout == Layout::kF ? 1 : 0, 1, &out);
  PutLittle(h.shape.size(), 1, &out);
  PutLittle(h.device, 1, &out);
  PutLittle(h.payload_bytes, 8, &out);
  PutLittle(static_cast<uint64_t>(h.ttl_nanos), 8, &out);
  for (uint64_t d : h.shape) PutLittle(d, 8, &out);
  absl::StrAppend(&out, h.scope, h.id, h.name);
  PutLittle(ExtendCrc32c(0, out.data(), out.size()), 4, &out);
  return out;
}

absl::StatusOr<size_t> DecodePersistPrefix(absl::string_view prefix) {
  if (prefix.substr(0, kPersistMagicBytes) !=
      absl::string_view(kPersistMagic, kPersistMagicBytes)) {
    return absl::InvalidArgumentError("not a gpucompute buffer file (no magic number)");
  }
  if (prefix.size() < kPersistPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrCat("truncated: ", prefix.size(), " bytes"));
  }
  const uint64_t version = GetLittle(prefix, 8, 4);
  if (version != kPersistFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "format version ", version, "; this server reads version ", kPersistFormatVersion,
        " only (written by another gpucompute version: restore it with that one)"));
  }
  const uint64_t length = GetLittle(prefix, 12, 4);
  if (length < kPersistFixedHeaderBytes + 4 || length > kPersistMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", length, " is out of range"));
  }
  return static_cast<size_t>(length);
}

absl::StatusOr<PersistedHeader> DecodePersistHeader(absl::string_view header) {
  ASSIGN_OR_RETURN(size_t length, DecodePersistPrefix(header));
  if (header.size() != length) {
    return absl::InvalidArgumentError(absl::StrCat("truncated: the header needs ", length,
                                                   " bytes, the file has ", header.size()));
  }
  const uint32_t crc = static_cast<uint32_t>(GetLittle(header, length - 4, 4));
  if (ExtendCrc32c(0, header.data(), length - 4) != crc) {
    return absl::DataLossError("the header's CRC32C does not match: the file is corrupt");
  }
  PersistedHeader h;
  const size_t scope_bytes = GetLittle(header, 16, 2);
  const size_t id_bytes = GetLittle(header, 18, 2);
  const size_t name_bytes = GetLittle(header, 20, 2);
  const uint64_t dtype = GetLittle(header, 22, 1);
  const uint64_t layout = GetLittle(header, 23, 1);
  const size_t dims = GetLittle(header, 24, 1);
  h.device = static_cast<int>(GetLittle(header, 25, 1));
  h.payload_bytes = GetLittle(header, 26, 8);
  const uint64_t ttl = GetLittle(header, 34, 8);
  if (ttl > static_cast<uint64_t>(kMaxTtlSeconds * 1e9)) {
    return absl::InvalidArgumentError(absl::StrCat("the lease of ", ttl, " ns is too long"));
  }
  h.ttl_nanos = static_cast<int64_t>(ttl);
  if (dims > kMaxDimensions) {
    return absl::InvalidArgumentError(absl::StrCat("the shape has ", dims, " dimensions"));
  }
  if (length != kPersistFixedHeaderBytes + 8 * dims + scope_bytes + id_bytes + name_bytes + 4) {
    return absl::InvalidArgumentError("the header's field lengths do not add up to its length");
  }
  if (dtype >= static_cast<uint64_t>(kNumDTypes)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", dtype));
  }
  if (layout > 1) return absl::InvalidArgumentError(absl::StrCat("unknown layout ", layout));
  h.dtype = static_cast<DType>(dtype);
  h.layout = layout == 1 ? Layout::kF : Layout::kC;
  size_t at = kPersistFixedHeaderBytes;
  for (size_t i = 0; i < dims; ++i, at += 8) h.shape.push_back(GetLittle(header, at, 8));
  h.scope = std::string(header.substr(at, scope_bytes));
  at += scope_bytes;
  h.id = std::string(header.substr(at, id_bytes));
  at += id_bytes;
  h.name = std::string(header.substr(at, name_bytes));
  ASSIGN_OR_RETURN(uint64_t elements, CheckedElementCount(h.shape, DTypeSize(h.dtype)));
  if (elements * DTypeSize(h.dtype) != h.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the payload length ", h.payload_bytes, " does not match the shape"));
  }
  if (h.scope.empty()) return absl::InvalidArgumentError("the buffer has no owner scope");
  if (!IsBufferId(h.id)) return absl::InvalidArgumentError("the buffer id is malformed");
  if (h.name.empty()) return absl::InvalidArgumentError("the buffer has no name");
  RETURN_IF_ERROR(ValidateBufferName(h.name));
  return h;
}

absl::StatusOr<PersistedFile> DecodePersistFile(absl::string_view file) {
  ASSIGN_OR_RETURN(size_t length, DecodePersistPrefix(file.substr(0, kPersistPrefixBytes)));
  if (file.size() < length) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated: the header needs ", length, " bytes, the file has ", file.size()));
  }
  PersistedFile out;
  ASSIGN_OR_RETURN(out.header, DecodePersistHeader(file.substr(0, length)));
  const uint64_t rest = file.size() - length;
  if (rest < 4 || rest - 4 != out.header.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(rest < 4 || rest - 4 < out.header.payload_bytes ? "truncated" : "too long",
                     ": the header promises ", out.header.payload_bytes,
                     " payload bytes and a CRC, the file has ", rest, " bytes after the header"));
  }
  out.payload = file.substr(length, out.header.payload_bytes);
  const uint32_t crc = static_cast<uint32_t>(GetLittle(file, file.size() - 4, 4));
  if (ExtendCrc32c(0, out.payload.data(), out.payload.size()) != crc) {
    return absl::DataLossError("the payload's CRC32C does not match: the file is corrupt");
  }
  return out;
}

}  // namespace gpucompute
