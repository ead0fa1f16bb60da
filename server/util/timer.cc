#include "server/util/timer.h"

#include "absl/time/time.h"

namespace gpucompute {

Timer::Timer() : thread_([this] { Run(); }) {}

Timer::~Timer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

uint64_t Timer::Schedule(Clock::time_point when, absl::AnyInvocable<void() &&> fn) {
  uint64_t key;
  {
    absl::MutexLock lock(&mu_);
    key = next_key_++;
    queue_.emplace(when, std::make_pair(key, std::move(fn)));
    keys_.emplace(key, when);
  }
  cv_.SignalAll();
  return key;
}

bool Timer::Cancel(uint64_t key) {
  absl::MutexLock lock(&mu_);
  auto k = keys_.find(key);
  if (k == keys_.end()) return false;
  auto [begin, end] = queue_.equal_range(k->second);
  for (auto it = begin; it != end; ++it) {
    if (it->second.first == key) {
      queue_.erase(it);
      break;
    }
  }
  keys_.erase(k);
  return true;
}

void Timer::Run() {
  mu_.Lock();
  while (!stop_) {
    if (queue_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    auto first = queue_.begin();
    const Clock::time_point now = Clock::now();
    if (first->first > now) {
      // The wait is relative to the steady clock, so a change of the wall clock does not
      // move a deadline. Woken early, the loop looks at the queue again.
      cv_.WaitWithTimeout(&mu_, absl::FromChrono(first->first - now));
      continue;
    }
    auto fn = std::move(first->second.second);
    keys_.erase(first->second.first);
    queue_.erase(first);
    mu_.Unlock();
    std::move(fn)();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace gpucompute
