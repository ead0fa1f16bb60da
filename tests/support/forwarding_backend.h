// A Backend that passes every call on to another backend it owns, for tests that wrap a
// real backend (the CPU backend, usually) and override only the calls they count, fail
// or hold; an override calls ForwardingBackend's to do the work:
//
//   class CountingFills final : public ForwardingBackend {
//    public:
//     CountingFills() : ForwardingBackend(std::make_unique<cpu::CpuBackend>(2)) {}
//     absl::Status Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t bits,
//                       int64_t count) override {
//       ++fills;
//       return ForwardingBackend::Fill(stream, dst, dtype, bits, count);
//     }
//     std::atomic<int> fills{0};
//   };
//
// Every virtual of Backend is forwarded, the optional ones too, so that a wrapped backend
// behaves as it does unwrapped.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_FORWARDING_BACKEND_H_
#define GPUCOMPUTE_TESTS_SUPPORT_FORWARDING_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/backend.h"

namespace gpucompute::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> wrapped) : wrapped_(std::move(wrapped)) {}

  Backend& wrapped() { return *wrapped_; }
  const Backend& wrapped() const { return *wrapped_; }

  absl::string_view name() const override { return wrapped_->name(); }
  const std::vector<DeviceDescription>& devices() const override { return wrapped_->devices(); }
  absl::StatusOr<DeviceMemory> Allocate(int device, uint64_t bytes) override {
    return wrapped_->Allocate(device, bytes);
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override {
    return wrapped_->CreateStream(device);
  }
  absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) override {
    return wrapped_->ElapsedSeconds(start, end);
  }

  absl::Status CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst, uint64_t dst_offset,
                            uint64_t bytes) override {
    return wrapped_->CopyFromHost(stream, src, dst, dst_offset, bytes);
  }
  absl::Status CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset, void* dst,
                          uint64_t bytes) override {
    return wrapped_->CopyToHost(stream, src, src_offset, dst, bytes);
  }
  absl::Status Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset, DeviceMemory& dst,
                    uint64_t dst_offset, uint64_t bytes) override {
    return wrapped_->Copy(stream, src, src_offset, dst, dst_offset, bytes);
  }
  absl::Status Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits,
                    int64_t count) override {
    return wrapped_->Fill(stream, dst, dtype, value_bits, count);
  }
  absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                         std::span<const DeviceMemory* const> inputs,
                                         DeviceMemory& out, DType out_dtype, int64_t n) override {
    return wrapped_->Elementwise(stream, program, inputs, out, out_dtype, n);
  }
  absl::Status Reduce(Stream& stream, ReduceKind kind, DType in_dtype, const DeviceMemory& in,
                      const ReduceShape& shape, DeviceMemory& out) override {
    return wrapped_->Reduce(stream, kind, in_dtype, in, shape, out);
  }
  absl::Status Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha,
                    const DeviceMemory& a, const DeviceMemory& x, double beta,
                    DeviceMemory& y) override {
    return wrapped_->Gemv(stream, dtype, shape, alpha, a, x, beta, y);
  }
  absl::Status Random(Stream& stream, const RandomParams& params, DType dtype, DeviceMemory& out,
                      int64_t n) override {
    return wrapped_->Random(stream, params, dtype, out, n);
  }

  absl::StatusOr<double> PrepareElementwise(const expr::Program& program,
                                            DType out_dtype) override {
    return wrapped_->PrepareElementwise(program, out_dtype);
  }
  PoolUsage MemoryPoolUsage(int device) const override { return wrapped_->MemoryPoolUsage(device); }
  int DispatchWindow() const override { return wrapped_->DispatchWindow(); }
  void StopKernels(absl::Status status) override { wrapped_->StopKernels(std::move(status)); }
  void PollCompletions() override { wrapped_->PollCompletions(); }
  absl::StatusOr<PoolUsage> TrimMemoryPool(int device, uint64_t keep_bytes) override {
    return wrapped_->TrimMemoryPool(device, keep_bytes);
  }
  absl::Status StartProfiler() override { return wrapped_->StartProfiler(); }
  absl::Status StopProfiler() override { return wrapped_->StopProfiler(); }
  void PushRange(const std::string& name) override { wrapped_->PushRange(name); }
  void PopRange() override { wrapped_->PopRange(); }

  absl::Status PinHostMemory(void* ptr, uint64_t bytes, bool read_only) override {
    return wrapped_->PinHostMemory(ptr, bytes, read_only);
  }
  void UnpinHostMemory(void* ptr) override { wrapped_->UnpinHostMemory(ptr); }
  absl::Status CopyFromPinnedHost(Stream& stream, const void* src, DeviceMemory& dst,
                                  uint64_t dst_offset, uint64_t bytes) override {
    return wrapped_->CopyFromPinnedHost(stream, src, dst, dst_offset, bytes);
  }
  absl::Status CopyToPinnedHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset,
                                void* dst, uint64_t bytes) override {
    return wrapped_->CopyToPinnedHost(stream, src, src_offset, dst, bytes);
  }
  absl::StatusOr<DeviceMemory> AllocateExportable(int device, uint64_t bytes) override {
    return wrapped_->AllocateExportable(device, bytes);
  }
  absl::StatusOr<std::string> ExportIpcHandle(const DeviceMemory& memory) override {
    return wrapped_->ExportIpcHandle(memory);
  }
  absl::StatusOr<DeviceMemory> OpenIpcHandle(int device, absl::string_view handle,
                                             uint64_t bytes) override {
    return wrapped_->OpenIpcHandle(device, handle, bytes);
  }
  absl::StatusOr<DeviceMemory> AllocateHostStaging(uint64_t bytes) override {
    return wrapped_->AllocateHostStaging(bytes);
  }

  absl::Status health() const override { return wrapped_->health(); }
  void SetFailureListener(std::function<void(const absl::Status&)> listener) override {
    wrapped_->SetFailureListener(std::move(listener));
  }
  void ReportFailure(absl::Status status) override { wrapped_->ReportFailure(std::move(status)); }

 private:
  std::unique_ptr<Backend> wrapped_;
};

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_FORWARDING_BACKEND_H_
