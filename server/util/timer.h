// One thread that runs callbacks at deadlines: timeouts of waiting calls, and work that
// must leave the thread it was triggered on.
#ifndef GPUCOMPUTE_SERVER_UTIL_TIMER_H_
#define GPUCOMPUTE_SERVER_UTIL_TIMER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

class Timer {
 public:
  using Clock = std::chrono::steady_clock;

  Timer();
  ~Timer();  // runs nothing further; pending callbacks are dropped
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Runs fn on the timer thread at `when` (at once if past). Returns a key for Cancel.
  uint64_t Schedule(Clock::time_point when, absl::AnyInvocable<void() &&> fn);
  uint64_t Post(absl::AnyInvocable<void() &&> fn) { return Schedule(Clock::now(), std::move(fn)); }
  // True if the callback had not started and never will.
  bool Cancel(uint64_t key);

 private:
  void Run();

  absl::Mutex mu_;
  // Signalled when the queue's head or stop_ changes.
  absl::CondVar cv_;
  std::multimap<Clock::time_point, std::pair<uint64_t, absl::AnyInvocable<void() &&>>> queue_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Clock::time_point> keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_UTIL_TIMER_H_
