// The one reading of a byte size, shared by the server's flags, its configuration and
// quota files, the `gpucompute` CLI and the benchmarks.
//
// A size is a whole number of bytes written as Kubernetes writes memory quantities,
// which the deployment's manifests already use:
//
//   4096            bytes (a trailing B is allowed: 4096B)
//   64k  64K  64KB  powers of 1000: k/K, M, G, T (10^3, 10^6, 10^9, 10^12), B optional
//   64Ki 64KiB      powers of 1024: Ki, Mi, Gi, Ti (2^10, 2^20, 2^30, 2^40), B optional
//
// So 1G is 10^9 bytes and 1Gi (or 1GiB) is 2^30. Units are read without regard to case
// (512mb, 8gib), as the server always has; unlike Kubernetes, m is therefore mega, never
// milli, since a size is never a fraction of a byte. A decimal fraction is accepted when
// it comes to a whole number of bytes (1.5GiB, 0.5Ki), and refused otherwise (1.5, 0.1Ki),
// as are more than 18 decimal places.
// White space around the size is ignored. Refused, each with a message that says why:
// empty text, a sign, exponents, an unknown unit, a fraction of a byte, and more than
// 2^64-1 bytes.
#ifndef GPUCOMPUTE_COMMON_BYTE_SIZE_H_
#define GPUCOMPUTE_COMMON_BYTE_SIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpucompute {

// The bytes `text` stands for, or INVALID_ARGUMENT saying what is wrong with it.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_BYTE_SIZE_H_
