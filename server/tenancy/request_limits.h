// What one request may ask of the server: the size of its messages, the shapes of the
// buffers it creates, the length and nesting of its expressions. Each bound has a flag
// (server/config/flags.cc), a default, and a hard ceiling that no configuration passes; the
// server reports the bounds in use in GetServerInfo's Limits.
#ifndef GPUCOMPUTE_SERVER_TENANCY_REQUEST_LIMITS_H_
#define GPUCOMPUTE_SERVER_TENANCY_REQUEST_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gpucompute/v1/limits.h"
#include "server/expression/expression.h"

namespace gpucompute {

// Dimensions a buffer may have; the persisted-buffer format (persist_format.h) holds no
// more.
inline constexpr size_t kMaxDimensions = 8;
// Elements a buffer may have: 2^48 elements of 8 bytes are 2^51 bytes, far from
// overflowing the 64-bit sizes, offsets and element indices the kernels compute with.
inline constexpr uint64_t kMaxElements = uint64_t{1} << 48;
// The default bound: 2^40 elements (4 TiB of float32) is more than any device or host
// holds, so it refuses no array that could be allocated, yet it refuses absurd shapes
// (empty arrays with huge extents, random fills of 2^60 elements) before anything is
// allocated or computed.
inline constexpr uint64_t kDefaultMaxElements = uint64_t{1} << 40;
// The smallest message bound: clients built with limits.h upload in kDefaultChunkBytes
// chunks unless told otherwise, and those must still fit with their framing.
inline constexpr uint64_t kMinMessageBytes = kDefaultChunkBytes + kChunkOverheadBytes;

struct RequestLimits {
  // gRPC messages either way (--max-message-bytes), kMinMessageBytes to kMaxMessageBytes.
  uint64_t max_message_bytes = kMaxMessageBytes;
  // Dimensions of a buffer a request creates (--max-dimensions), 1 to kMaxDimensions.
  uint64_t max_dimensions = kMaxDimensions;
  // Elements of a buffer a request creates (--max-elements), 1 to kMaxElements; see
  // CheckShape for empty arrays.
  uint64_t max_elements = kDefaultMaxElements;
  // Bytes of an elementwise expression (--max-expression-bytes), 1 to kMaxExpressionBytes.
  uint64_t max_expression_bytes = kMaxExpressionBytes;
  // Nesting levels of an expression (--max-expression-depth), 1 to expr::kMaxNestingDepth.
  uint64_t max_expression_depth = expr::kMaxNestingDepth;

  // The largest chunk of an upload or download message: the message bound less the room
  // limits.h keeps for the framing around a chunk.
  uint64_t max_chunk_bytes() const { return max_message_bytes - kChunkOverheadBytes; }
};

// INVALID_ARGUMENT naming the flag ("--max-dimensions: must be from 1 to 8, not 9") if a
// bound is outside its range.
absl::Status ValidateRequestLimits(const RequestLimits& limits);

// INVALID_ARGUMENT naming the flag unless a buffer of `shape` is one a request may create:
// at most max_dimensions dimensions and at most max_elements elements. An empty array
// (some extent 0) is bounded as if its empty dimensions were not there, so that no product
// of its extents (a stride, a row count) exceeds max_elements either.
absl::Status CheckShape(const RequestLimits& limits, const std::vector<uint64_t>& shape);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_TENANCY_REQUEST_LIMITS_H_
