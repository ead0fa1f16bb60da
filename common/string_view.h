// The string_view policy. Code that calls Abseil (the server, the service, the client's
// internals) uses absl::string_view; plain C++ that needs no Abseil (kernels/, the
// expression compiler's lexer, the client's public API) uses std::string_view. Debian's
// Abseil is built with its own string_view, which std::string_view does not convert to
// implicitly, so where the two meet this is the one bridge.
#ifndef GPUCOMPUTE_COMMON_STRING_VIEW_H_
#define GPUCOMPUTE_COMMON_STRING_VIEW_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace gpucompute {

inline absl::string_view ToAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_STRING_VIEW_H_
