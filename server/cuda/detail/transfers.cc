// Copies of the CUDA backend between host and device: pageable host memory through the
// backend's pinned staging blocks, pinned host memory (host staging, pinned shared-memory
// regions) in one DMA, and device-to-device copies.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/detail/cuda_backend_impl.h"
#include "server/cuda/pinned_staging.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda::detail {

namespace {

// Splits a transfer of `bytes` into pieces of at most one staging block and calls
// fn(block, offset, piece) for each, with a block acquired for it; fn enqueues the piece
// and arranges for the block's release.
template <typename Fn>
absl::Status ForEachStagedPiece(PinnedStaging& staging, uint64_t bytes, Fn&& fn) {
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t piece = std::min(bytes - done, staging.block_bytes());
    ASSIGN_OR_RETURN(void* block, staging.Acquire());
    RETURN_IF_ERROR(fn(block, done, piece));
    done += piece;
  }
  return absl::OkStatus();
}

// What a host function does once a staged piece's DMA copy has completed: copy the block
// out to the caller's memory (downloads only) and give the block back. Runs on CUDA's
// callback thread as a stream operation, so later work on the stream waits for it.
struct StagedPieceDone {
  PinnedStaging* staging;
  void* block;
  char* deliver_to;  // null for uploads
  uint64_t bytes;

  static void CUDART_CB Run(void* p) {
    auto* self = static_cast<StagedPieceDone*>(p);
    if (self->deliver_to != nullptr) std::memcpy(self->deliver_to, self->block, self->bytes);
    self->staging->Release(self->block);
    delete self;
  }
};

}  // namespace

absl::Status CudaBackend::StagedCopy(CudaStream& stream, const char* src, char* dst, uint64_t bytes,
                                     bool to_device) {
  Device& d = *devices_[stream.device()];
  PinnedStaging& staging = bytes <= kSmallBlockBytes ? *d.small_staging : *d.large_staging;
  return ForEachStagedPiece(
      staging, bytes, [&](void* block, uint64_t offset, uint64_t piece) -> absl::Status {
        // Uploads copy into the block now and DMA from it; downloads DMA into it and copy out
        // when the DMA is done.
        if (to_device) std::memcpy(block, src + offset, piece);
        absl::Status s =
            Check(cudaMemcpyAsync(
                      to_device ? dst + offset : block, to_device ? block : src + offset, piece,
                      to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream.get()),
                  "cudaMemcpyAsync", __FILE__, __LINE__);
        if (!s.ok()) {
          staging.Release(block);
          return s;
        }
        auto* done =
            new StagedPieceDone{&staging, block, to_device ? nullptr : dst + offset, piece};
        s = Check(cudaLaunchHostFunc(stream.get(), &StagedPieceDone::Run, done),
                  "cudaLaunchHostFunc", __FILE__, __LINE__);
        // A block whose copy was enqueued but whose release was not is lost with the stream.
        if (!s.ok()) delete done;
        return s;
      });
}

absl::Status CudaBackend::CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst,
                                       uint64_t dst_offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  return StagedCopy(AsCuda(stream), static_cast<const char*>(src), Bytes(dst) + dst_offset, bytes,
                    /*to_device=*/true);
}

absl::Status CudaBackend::CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                                     void* dst, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  return StagedCopy(AsCuda(stream), Bytes(src) + src_offset, static_cast<char*>(dst), bytes,
                    /*to_device=*/false);
}

absl::Status CudaBackend::Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                               DeviceMemory& dst, uint64_t dst_offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (bytes == 0 || (src.data() == dst.data() && src_offset == dst_offset)) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMemcpyAsync(Bytes(dst) + dst_offset, Bytes(src) + src_offset, bytes,
                             cudaMemcpyDeviceToDevice, AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyFromPinnedHost(Stream& stream, const void* src, DeviceMemory& dst,
                                             uint64_t dst_offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (bytes == 0) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMemcpyAsync(Bytes(dst) + dst_offset, src, bytes, cudaMemcpyHostToDevice,
                             AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToPinnedHost(Stream& stream, const DeviceMemory& src,
                                           uint64_t src_offset, void* dst, uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(stream.device()));
  if (bytes == 0) return absl::OkStatus();
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaMemcpyAsync(dst, Bytes(src) + src_offset, bytes, cudaMemcpyDeviceToHost,
                             AsCuda(stream).get()));
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemory> CudaBackend::AllocateHostStaging(uint64_t bytes) {
  RETURN_IF_ERROR(CheckHealthy());
  void* p = nullptr;
  // Portable: pinned for every device's DMA engines, whichever device a transfer uses.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(
      Check, cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocPortable));
  return DeviceMemory(p, bytes, -1,
                      [](void* ptr, uint64_t) { LogIfFailed(cudaFreeHost(ptr), "cudaFreeHost"); });
}

}  // namespace gpucompute::cuda::detail
