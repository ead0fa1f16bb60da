// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#ifndef GPUCOMPUTE_SERVER_CPU_THREAD_POOL_H_
#define GPUCOMPUTE_SERVER_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace gpucompute::cpu {

// ParallelFor splits [0, n) into contiguous chunks of `grain` indices (the last may be
// shorter) and runs body(begin, end) for every chunk, on the pool's workers and the
// calling thread, returning when all chunks are done. The chunking depends only on n and
// grain, never on the number of threads, so a reduction that combines per-chunk results
// in chunk order is deterministic. Several threads may call ParallelFor at once.
class ThreadPool {
 public:
  // While one lives on a thread, the ParallelFor calls made on that thread start no more
  // chunks once `*stop` is set, and return when the chunks under way are done: a kernel
  // stopped at shutdown ends within a chunk, its output part written.
  class StopScope {
   public:
    explicit StopScope(const std::atomic<bool>* stop);
    ~StopScope();
    StopScope(const StopScope&) = delete;
    StopScope& operator=(const StopScope&) = delete;

   private:
    const std::atomic<bool>* const outer_;
  };

  // threads == 0 means one per hardware thread.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const;  // worker threads, counting the caller as one
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_THREAD_POOL_H_
