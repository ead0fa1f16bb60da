// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of transfer chunks
// (UploadRequest.chunk_crc32c, DownloadResponse.data_crc32c). Uses the SSE4.2 crc32
// instruction where the CPU has it, else a table; both give the same value.
#ifndef GPUCOMPUTE_COMMON_CRC32C_H_
#define GPUCOMPUTE_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpucompute {

// Extends `crc` (the CRC32C of the bytes before, 0 for none) over `data`:
// Crc32c(Crc32c(0, a), b) == Crc32c(0, a + b).
uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(std::string_view data) { return ExtendCrc32c(0, data.data(), data.size()); }

// The table implementation alone, for tests that compare the two.
uint32_t ExtendCrc32cPortable(uint32_t crc, const void* data, size_t size);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_COMMON_CRC32C_H_
