#include "server/util/warm_lane.h"

#include <chrono>
#include <utility>

#include "server/util/thread_name.h"

namespace gpucompute {
namespace {

// One step of a busy wait: tells the core it spins, so that it draws less power and
// leaves more to its sibling hyperthread.
inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

}  // namespace

WarmLane::WarmLane(absl::Duration spin, const char* name, absl::AnyInvocable<void()> idle)
    : spin_(spin), idle_(std::move(idle)) {
  if (spin_ <= absl::ZeroDuration()) return;
  thread_ = std::thread([this, name] { Loop(name); });
}

WarmLane::~WarmLane() {
  if (!thread_.joinable()) return;
  // Only an idle or sleeping lane is told to stop: a job in hand runs to its end first.
  for (Job* expected = nullptr;
       !slot_.compare_exchange_weak(expected, kStopping, std::memory_order_acq_rel);) {
    if (expected != kAsleep) expected = nullptr;
    Relax();
  }
  { absl::MutexLock lock(&sleep_mu_); }  // a sleeping lane re-reads the slot
  thread_.join();
}

void WarmLane::Run(absl::FunctionRef<void()> fn) {
  Job job{fn};
  Job* expected = nullptr;
  if (thread_.joinable() &&
      slot_.compare_exchange_strong(expected, &job, std::memory_order_acq_rel)) {
    // A small job takes microseconds; one that takes longer (a kernel compiled on first
    // use) is waited for with yields rather than a hard spin. Only the job is read from
    // here on: the lane counts it and may be destroyed before this returns.
    const auto relax_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    while (!job.done.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() < relax_until) {
        Relax();
      } else {
        std::this_thread::yield();
      }
    }
    return;
  }
  fn();
  on_caller_.fetch_add(1, std::memory_order_relaxed);
  // Woken after the job, not before: the job does not wait for the wake-up, and the lane
  // is awake for the caller's next call.
  if (expected == kAsleep) Wake();
}

void WarmLane::Wake() {
  Job* expected = kAsleep;
  if (!slot_.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel)) return;
  // The sleeper's condition is evaluated under the mutex: taking it once the slot has
  // changed is what wakes it.
  absl::MutexLock lock(&sleep_mu_);
}

void WarmLane::Loop(const char* name) {
  NameThisThread(name);
  using Clock = std::chrono::steady_clock;
  const auto spin = absl::ToChronoNanoseconds(spin_);
  const auto idle_interval = absl::ToChronoNanoseconds(kIdleInterval);
  Clock::time_point idle_since = Clock::now();
  Clock::time_point next_idle = idle_since;
  for (;;) {
    Job* job = slot_.load(std::memory_order_acquire);
    if (job == kStopping) return;
    if (job != nullptr) {
      job->fn();
      on_lane_.fetch_add(1, std::memory_order_relaxed);
      slot_.store(nullptr, std::memory_order_release);
      job->done.store(true, std::memory_order_release);  // the caller may return now
      idle_since = Clock::now();
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now - idle_since < spin) {
      if (idle_ != nullptr && now >= next_idle &&
          slot_.compare_exchange_strong(job, kIdling, std::memory_order_acq_rel)) {
        idle_();
        slot_.store(nullptr, std::memory_order_release);
        next_idle = Clock::now() + idle_interval;
      } else {
        Relax();
      }
      continue;
    }
    // Asleep only if no job came meanwhile.
    if (!slot_.compare_exchange_strong(job, kAsleep, std::memory_order_acq_rel)) continue;
    absl::MutexLock lock(&sleep_mu_);
    sleep_mu_.Await(absl::Condition(
        +[](std::atomic<Job*>* slot) { return slot->load(std::memory_order_acquire) != kAsleep; },
        &slot_));
    idle_since = Clock::now();
  }
}

}  // namespace gpucompute
