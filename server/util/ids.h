// Unguessable identifiers for buffers, streams and operations.
#ifndef GPUCOMPUTE_SERVER_UTIL_IDS_H_
#define GPUCOMPUTE_SERVER_UTIL_IDS_H_

#include <string>
#include "absl/strings/string_view.h"

namespace gpucompute {

// `prefix` followed by 32 hex digits from the kernel's CSPRNG (128 bits, fetched in
// blocks per thread).
std::string NewId(absl::string_view prefix);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_IDS_H_
