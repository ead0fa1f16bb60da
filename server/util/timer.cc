#include "server/util/timer.h"

namespace gpucompute {

Timer::Timer() : thread_([this] { Run(); }) {}

Timer::~Timer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Timer::Schedule(Clock::time_point when, absl::AnyInvocable<void() &&> fn) {
  uint64_t key;
  {
    std::lock_guard lock(mu_);
    key = next_key_++;
    queue_.emplace(when, std::make_pair(key, std::move(fn)));
    keys_.emplace(key, when);
  }
  cv_.notify_all();
  return key;
}

bool Timer::Cancel(uint64_t key) {
  std::lock_guard lock(mu_);
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
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (queue_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = queue_.begin();
    if (first->first > Clock::now()) {
      // A copy: Cancel may erase the entry while this waits.
      const Clock::time_point deadline = first->first;
      cv_.wait_until(lock, deadline);
      continue;
    }
    auto fn = std::move(first->second.second);
    keys_.erase(first->second.first);
    queue_.erase(first);
    lock.unlock();
    std::move(fn)();
    lock.lock();
  }
}

}  // namespace gpucompute
