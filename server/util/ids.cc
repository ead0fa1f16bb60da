#include "server/util/ids.h"

#include <sys/random.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace gpucompute {
namespace {

// Bytes from the kernel's CSPRNG, fetched a block at a time per thread: a getrandom call
// per id cost a system call on every submission and every new buffer. Each byte is
// handed out once.
class RandomBytes {
 public:
  void Fill(uint8_t* out, size_t n) {
    while (n > 0) {
      if (next_ == sizeof(block_)) Refill();
      const size_t take = std::min(n, sizeof(block_) - next_);
      std::memcpy(out, block_ + next_, take);
      std::memset(block_ + next_, 0, take);  // not kept in memory once used
      next_ += take;
      out += take;
      n -= take;
    }
  }

 private:
  void Refill() {
    size_t got = 0;
    while (got < sizeof(block_)) {
      const ssize_t n = getrandom(block_ + got, sizeof(block_) - got, 0);
      if (n < 0) std::abort();  // the kernel's CSPRNG is never expected to fail
      got += static_cast<size_t>(n);
    }
    next_ = 0;
  }

  uint8_t block_[4096];
  size_t next_ = sizeof(block_);
};

}  // namespace

std::string NewId(absl::string_view prefix) {
  thread_local RandomBytes random;
  uint8_t bytes[16];
  random.Fill(bytes, sizeof(bytes));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  id.reserve(prefix.size() + 2 * sizeof(bytes));
  for (uint8_t b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}

}  // namespace gpucompute
