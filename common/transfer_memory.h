// A process-wide allocator setting for programs that move large arrays over gRPC.
//
// gRPC receives every message into blocks it mallocs (up to a few MiB each) and frees
// once the message has been read. With glibc's default thresholds such blocks are mapped
// fresh and unmapped again, or trimmed off the heap, message after message: every byte
// received then lands on a page the kernel must fault in and zero first, which can cost
// more than the copy itself; keeping the blocks mapped makes one-stream transfers several
// times faster where page faults are slow (docs/performance.md, "Transfer memory retained").
#ifndef GPUCOMPUTE_COMMON_TRANSFER_MEMORY_H_
#define GPUCOMPUTE_COMMON_TRANSFER_MEMORY_H_

#include <cstdint>

namespace gpucompute {

// Blocks below this are taken from the heap, not mapped one by one.
inline constexpr uint64_t kRetainedBlockBytes = uint64_t{32} << 20;
// Free memory at the top of the heap beyond this goes back to the system.
inline constexpr uint64_t kRetainedFreeBytes = uint64_t{256} << 20;

// Keeps freed blocks below kRetainedBlockBytes for reuse, and up to kRetainedFreeBytes of
// free heap memory, instead of returning them to the system after each message. Call it
// once, at the start of a program (the server, the CLI and the benchmark do); it changes
// malloc for the whole process, so a library does not call it by itself. It sets glibc's
// malloc only: a no-op where the C library is not glibc, and moot where another
// allocator replaces malloc (the serving programs are built on tcmalloc by default, which
// keeps freed spans for reuse by itself; GPUCOMPUTE_ALLOCATOR in CMakeLists.txt).
void RetainTransferMemory();

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_TRANSFER_MEMORY_H_
