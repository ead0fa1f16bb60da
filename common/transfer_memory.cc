#include "common/transfer_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gpucompute {

void RetainTransferMemory() {
#if defined(__GLIBC__)
  // Setting either threshold also stops glibc from adjusting them by itself.
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kRetainedBlockBytes));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(kRetainedFreeBytes));
#endif
}

}  // namespace gpucompute
