// Fuzzes request validation with random protobuf messages: every check the service makes
// before it queues anything (server/service/operation_planner.h), against a CPU backend
// holding a few buffers of each kind. A request either plans or is refused with a status;
// nothing it asks for may crash, overflow or allocate past the memory limit.
//
// Input: one byte choosing the message (even: SubmitRequest, odd: CreateBufferRequest),
// then the message's wire format.
#include <cstddef>
#include <cstdint>
#include <memory>

#include <google/protobuf/stubs/logging.h>

#include "gpucompute/v1/gpucompute.pb.h"
#include "server/core/buffer_registry.h"
#include "server/cpu/cpu_backend.h"
#include "server/core/executor.h"
#include "server/service/operation_planner.h"
#include "server/service/service_context.h"
#include "server/util/timer.h"

namespace gpucompute {
namespace {

constexpr char kClient[] = "fuzz";

// The server's parts, built once: buffers "v64" (float64, 64), "v32" (float32, 64), "i32"
// (int32, 64), "b" (bool, 64), "m" (float64, 8 x 8) and "mf" (float32, 8 x 8, F order).
struct World {
  World()
      : backend(1),
        limiter(16 << 20),
        registry(backend, limiter),
        executor(*Executor::Create(backend)),
        ctx{backend, *executor, registry, limiter, timer} {
    Add("v64", DType::kFloat64, {64}, Layout::kC);
    Add("v32", DType::kFloat32, {64}, Layout::kC);
    Add("i32", DType::kInt32, {64}, Layout::kC);
    Add("b", DType::kBool, {64}, Layout::kC);
    Add("m", DType::kFloat64, {8, 8}, Layout::kC);
    Add("mf", DType::kFloat32, {8, 8}, Layout::kF);
  }

  void Add(const char* name, DType dtype, std::vector<uint64_t> shape, Layout layout) {
    BufferHandle b = *registry.Allocate(kClient, name, dtype, std::move(shape), layout, 0);
    (void)registry.Register(b);
  }

  cpu::CpuBackend backend;
  MemoryLimiter limiter;
  BufferRegistry registry;
  std::unique_ptr<Executor> executor;
  Timer timer;
  ServiceContext ctx;
};

}  // namespace
}  // namespace gpucompute

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpucompute;
  // Lives for the process, as a server's would. Protobuf's complaints about malformed
  // strings, which are most inputs, would drown the fuzzer's own output.
  static World* world = (google::protobuf::SetLogHandler(nullptr), new World());
  if (size < 1) return 0;
  const uint64_t used = world->limiter.used();
  if (data[0] % 2 == 0) {
    v1::SubmitRequest request;
    if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
    (void)PlanOperation(world->ctx, kClient, request);
  } else {
    v1::CreateBufferRequest request;
    if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
    (void)AllocateFromRequest(world->ctx, kClient, request);
  }
  // What a refused or dropped plan allocated is given back.
  if (world->limiter.used() != used) __builtin_trap();
  return 0;
}
