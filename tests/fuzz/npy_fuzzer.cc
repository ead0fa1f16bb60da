// Fuzzes the .npy reader: the header parser and the whole-file parser, which must reject
// any file whose header or size is inconsistent, and never read past the input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "client/cpp/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  (void)gpucompute::ParseNpyHeader(file);
  absl::StatusOr<gpucompute::NpyView> view = gpucompute::ParseNpy(file);
  if (view.ok()) {
    // The data it found must lie within the input and match the header's size.
    const absl::StatusOr<uint64_t> bytes = gpucompute::NpyDataBytes(view->parsed.header);
    if (!bytes.ok() || *bytes != view->data.size() || view->data.data() < file.data() ||
        view->data.data() + view->data.size() > file.data() + file.size()) {
      __builtin_trap();
    }
    // A header that parsed encodes again.
    (void)gpucompute::EncodeNpyHeader(view->parsed.header);
  }
  return 0;
}
