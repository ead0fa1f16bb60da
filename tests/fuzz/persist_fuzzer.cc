// Fuzzes the reader of persisted buffer files (server/persistence/persist_format.h): whatever the
// bytes, it must refuse them or return a header that encodes back to the same bytes and
// a payload that lies within the input and matches the header's size.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "server/persistence/persist_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  (void)gpucompute::DecodePersistPrefix(file.substr(0, gpucompute::kPersistPrefixBytes));
  absl::StatusOr<gpucompute::PersistedFile> parsed = gpucompute::DecodePersistFile(file);
  if (!parsed.ok()) return 0;
  const gpucompute::PersistedHeader& h = parsed->header;
  if (parsed->payload.size() != h.payload_bytes || parsed->payload.data() < file.data() ||
      parsed->payload.data() + parsed->payload.size() > file.data() + file.size()) {
    __builtin_trap();
  }
  // A header that was accepted is canonical: encoding it again gives its bytes.
  absl::StatusOr<std::string> encoded = gpucompute::EncodePersistHeader(h);
  if (!encoded.ok() || file.substr(0, encoded->size()) != *encoded ||
      encoded->size() + h.payload_bytes + 4 != file.size()) {
    __builtin_trap();
  }
  return 0;
}
