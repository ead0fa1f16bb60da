// A thread kept running between calls, for the latency-bound part of a call that waits
// on its answer: planning and launching a small operation, or a chain's steps. Handed a
// job, it runs it on a core whose caches still hold the planner, the executor and the
// CUDA driver from the call before, where a gRPC thread comes to each call cold, and
// launches sooner (docs/performance.md, "The warm lane", has the figures).
//
// The thread spins for a while after each job (and after a wake-up), then sleeps: a core
// busy while calls come, which buys each of them those microseconds. While it spins idle
// it does the idle work it was given every few microseconds: the server's polls the
// backend's completions, so that the operation a call just launched is seen done by a
// thread already running. A call that finds the lane busy or asleep runs its job itself,
// so the lane never makes one call wait for another's job; one that finds it asleep
// wakes it once its own job is done.
#ifndef GPUCOMPUTE_SERVER_UTIL_WARM_LANE_H_
#define GPUCOMPUTE_SERVER_UTIL_WARM_LANE_H_

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpucompute {

class WarmLane {
 public:
  // Spins for `spin` after each job, calling `idle` (if any) every kIdleInterval
  // meanwhile; its thread is named `name` (15 characters are kept). A zero `spin` starts
  // no thread: every job runs on its caller's, and `idle` never runs.
  WarmLane(absl::Duration spin, const char* name, absl::AnyInvocable<void()> idle = nullptr);
  // Lets the job in hand, if any, finish, then stops the thread.
  ~WarmLane();
  WarmLane(const WarmLane&) = delete;
  WarmLane& operator=(const WarmLane&) = delete;

  // Runs `job` and returns once it has run: on the lane's thread if that is awake and
  // idle, else on the caller's (so a job, or the idle work, that calls Run runs the
  // inner job itself).
  void Run(absl::FunctionRef<void()> job);

  static constexpr absl::Duration kIdleInterval = absl::Microseconds(2);

  // Jobs run so far on the lane's thread, and on their callers'.
  uint64_t ran_on_lane() const { return on_lane_.load(std::memory_order_relaxed); }
  uint64_t ran_on_caller() const { return on_caller_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    absl::FunctionRef<void()> fn;
    // Set by the lane once it is done with the job: the caller waits for this, not for
    // the slot, so that it touches nothing of the lane after handing the job over (the
    // lane may be destroyed as soon as its slot is free again).
    std::atomic<bool> done{false};
  };
  // The slot's markers: the lane sleeps, stops, or does its idle work (when a caller
  // runs its job itself, as when the lane is busy). None is a job's address.
  static inline Job* const kAsleep = reinterpret_cast<Job*>(1);
  static inline Job* const kStopping = reinterpret_cast<Job*>(2);
  static inline Job* const kIdling = reinterpret_cast<Job*>(3);

  void Loop(const char* name);
  void Wake();

  const absl::Duration spin_;
  absl::AnyInvocable<void()> idle_;
  // The lane's whole state: null while it spins idle, the job it was handed, or one of
  // the markers. A caller hands a job over by swapping it in for null; the lane puts null
  // back once the job has run, which is what the caller waits for.
  std::atomic<Job*> slot_{nullptr};
  absl::Mutex sleep_mu_;  // what the lane sleeps on; its condition reads slot_
  std::atomic<uint64_t> on_lane_{0};
  std::atomic<uint64_t> on_caller_{0};
  std::thread thread_;  // last: it runs on the members above
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_WARM_LANE_H_
