#include "server/ids.h"

#include <sys/random.h>

#include <cstdint>
#include <cstdlib>

namespace gpucompute {

std::string NewId(absl::string_view prefix) {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) std::abort();  // the kernel's CSPRNG is never expected to fail
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (uint8_t b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}

}  // namespace gpucompute
