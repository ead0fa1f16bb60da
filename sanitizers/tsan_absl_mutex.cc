// absl::Mutex, absl::CondVar and absl::Notification as ThreadSanitizer needs to see them.
// Linked into every program of a ThreadSanitizer build, and only there (see CMakeLists.txt
// in this directory).
//
// Why: TSan learns of a lock only through annotations (__tsan_mutex_pre_lock and the rest)
// that Abseil's mutex.cc makes when it is itself compiled with -fsanitize=thread. Debian's
// Abseil is not: its lock word changes through atomics and futex system calls that TSan
// cannot see, so no lock taken through absl::Mutex ordered anything, and TSan reported a
// race on every field that an ABSL_GUARDED_BY mutex really does protect.
//
// How: this file defines the out-of-line entry points of those classes in the program
// itself. The dynamic linker binds every call to them, ours and those made inside gRPC and
// Abseil (all go through the PLT), to these definitions. Each forwards to the library's own
// function, found with dlsym(RTLD_NEXT), inside the same annotations mutex.cc would make.
// Nothing is hidden: an access made without the lock is still reported. What TSan does not
// check is the body of an absl::Condition's predicate: Abseil evaluates it while the lock
// changes hands, and these annotations ignore accesses for the length of that call (as
// Abseil's own build ignores them for the predicates of other threads' waits).
//
// With an Abseil that is built with ThreadSanitizer, turn this off
// (-DGPUCOMPUTE_TSAN_ANNOTATIONS=OFF): its own annotations would be made twice.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/config.h"
#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if ABSL_LTS_RELEASE_VERSION != 20220623 || !ABSL_OPTION_USE_INLINE_NAMESPACE
#error "The entry points below are those of Abseil 20220623: check them against mutex.h."
#endif

namespace {

using absl::Condition;
using absl::CondVar;
using absl::Mutex;
using absl::Notification;

// The library's definition of the member function `name`, mangled less the "_ZN4absl<ns>"
// that every one of them starts with ("_ZNK4absl<ns>" for a const one). Each definition
// below looks its own up once, into a static.
#define GPUCOMPUTE_STR2(x) #x
#define GPUCOMPUTE_STR(x) GPUCOMPUTE_STR2(x)
template <typename F>
F Find(const char* name, bool is_const = false) {
  const std::string ns = GPUCOMPUTE_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string symbol =
      (is_const ? "_ZNK4absl" : "_ZN4absl") + std::to_string(ns.size()) + ns + name;
  void* f = dlsym(RTLD_NEXT, symbol.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found in the Abseil library\n", symbol.c_str());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

// The library's functions' types: the first parameter is `this`.
using Op = void (*)(Mutex*);
using TryOp = bool (*)(Mutex*);
using When = void (*)(Mutex*, const Condition&);
using WhenFor = bool (*)(Mutex*, const Condition&, absl::Duration);
using WhenUntil = bool (*)(Mutex*, const Condition&, absl::Time);
using CvWait = void (*)(CondVar*, Mutex*);
using CvWaitFor = bool (*)(CondVar*, Mutex*, absl::Duration);
using CvWaitUntil = bool (*)(CondVar*, Mutex*, absl::Time);

// The mutex whose operation this thread is annotating, if any. The library calls some of
// the functions below itself, on the same mutex (LockWhenWithTimeout calls
// LockWhenWithDeadline): only the outermost call is annotated, as TSan expects one
// annotation per operation. A call on another mutex (Notification's on its own) is one.
thread_local const Mutex* annotating = nullptr;

class Outermost {
 public:
  explicit Outermost(const Mutex* mu) : outer_(annotating), outermost_(mu != annotating) {
    annotating = mu;
  }
  ~Outermost() { annotating = outer_; }
  explicit operator bool() const { return outermost_; }

 private:
  const Mutex* const outer_;
  const bool outermost_;
};

// Takes the lock as `lock` does, annotated with `flags` (__tsan_mutex_read_lock for a
// shared one).
template <typename F>
auto Locking(Mutex* mu, unsigned flags, F lock) {
  const Outermost outermost(mu);
  if (outermost) __tsan_mutex_pre_lock(mu, flags);
  absl::Cleanup locked = [&] {
    if (outermost) __tsan_mutex_post_lock(mu, flags, 0);
  };
  return lock();
}

bool TryLocking(Mutex* mu, unsigned flags, bool (*try_lock)(Mutex*)) {
  const Outermost outermost(mu);
  if (!outermost) return try_lock(mu);
  flags |= __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(mu, flags);
  const bool locked = try_lock(mu);
  __tsan_mutex_post_lock(mu, locked ? flags : flags | __tsan_mutex_try_lock_failed, 0);
  return locked;
}

void Unlocking(Mutex* mu, unsigned flags, void (*unlock)(Mutex*)) {
  const Outermost outermost(mu);
  if (outermost) __tsan_mutex_pre_unlock(mu, flags);
  unlock(mu);
  if (outermost) __tsan_mutex_post_unlock(mu, flags);
}

// The mode `mu` is held in by the calling thread, read from the lock word (its only
// member; kMuWriter is bit 3) as Abseil's own annotations do.
unsigned HeldMode(const Mutex* mu) {
  static_assert(sizeof(Mutex) == sizeof(std::atomic<intptr_t>));
  constexpr intptr_t kMuWriter = 0x0008;
  const intptr_t word =
      reinterpret_cast<const std::atomic<intptr_t>*>(mu)->load(std::memory_order_relaxed);
  return (word & kMuWriter) != 0 ? 0 : __tsan_mutex_read_lock;
}

// Await and CondVar::Wait: `wait` lets go of the held `mu` and takes it again before it
// returns.
template <typename F>
auto Waiting(Mutex* mu, F wait) {
  const Outermost outermost(mu);
  const unsigned flags = outermost ? HeldMode(mu) : 0;
  if (outermost) __tsan_mutex_pre_unlock(mu, flags);
  absl::Cleanup relocked = [&] {
    if (!outermost) return;
    __tsan_mutex_post_unlock(mu, flags);
    __tsan_mutex_pre_lock(mu, flags);
    __tsan_mutex_post_lock(mu, flags, 0);
  };
  return wait();
}

// A Notification publishes what its notifier did before Notify() to whoever sees it
// notified: a wait may return at once, without taking the mutex, and HasBeenNotified() is
// an inline acquire load of the flag. So Notify() releases at the flag's address, which
// that load and the waits below acquire from. The flag follows the mutex, its only other
// member.
void* Flag(const Notification* n) {
  static_assert(sizeof(Notification) == 2 * sizeof(Mutex));
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(Mutex));
}
void Published(const Notification* n) { __tsan_release(Flag(n)); }
// Returns `notified`, having acquired what the notifier published if it is true.
bool Received(const Notification* n, bool notified = true) {
  if (notified) __tsan_acquire(Flag(n));
  return notified;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto lock = Find<Op>("5Mutex4LockEv");
  Locking(this, 0, [this] { lock(this); });
}
void Mutex::Unlock() {
  static const auto unlock = Find<Op>("5Mutex6UnlockEv");
  Unlocking(this, 0, unlock);
}
bool Mutex::TryLock() {
  static const auto try_lock = Find<TryOp>("5Mutex7TryLockEv");
  return TryLocking(this, 0, try_lock);
}
void Mutex::ReaderLock() {
  static const auto lock = Find<Op>("5Mutex10ReaderLockEv");
  Locking(this, __tsan_mutex_read_lock, [this] { lock(this); });
}
void Mutex::ReaderUnlock() {
  static const auto unlock = Find<Op>("5Mutex12ReaderUnlockEv");
  Unlocking(this, __tsan_mutex_read_lock, unlock);
}
bool Mutex::ReaderTryLock() {
  static const auto try_lock = Find<TryOp>("5Mutex13ReaderTryLockEv");
  return TryLocking(this, __tsan_mutex_read_lock, try_lock);
}

// The *When functions return holding the lock, whether or not the condition became true.
void Mutex::LockWhen(const Condition& cond) {
  static const auto lock = Find<When>("5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { lock(this, cond); });
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto lock =
      Find<WhenFor>("5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return lock(this, cond, timeout); });
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto lock =
      Find<WhenUntil>("5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return lock(this, cond, deadline); });
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto lock = Find<When>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, __tsan_mutex_read_lock, [&] { lock(this, cond); });
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto lock =
      Find<WhenFor>("5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, __tsan_mutex_read_lock, [&] { return lock(this, cond, timeout); });
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto lock =
      Find<WhenUntil>("5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, __tsan_mutex_read_lock, [&] { return lock(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static const auto await = Find<When>("5Mutex5AwaitERKNS0_9ConditionE");
  Waiting(this, [&] { await(this, cond); });
}
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto await =
      Find<WhenFor>("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Waiting(this, [&] { return await(this, cond, timeout); });
}
bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto await =
      Find<WhenUntil>("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Waiting(this, [&] { return await(this, cond, deadline); });
}

Mutex::~Mutex() {
  static const auto destroy = Find<Op>("5MutexD2Ev");
  destroy(this);
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
}

void CondVar::Wait(Mutex* mu) {
  static const auto wait = Find<CvWait>("7CondVar4WaitEPNS0_5MutexE");
  Waiting(mu, [&] { wait(this, mu); });
}
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto wait = Find<CvWaitFor>("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting(mu, [&] { return wait(this, mu, timeout); });
}
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto wait = Find<CvWaitUntil>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting(mu, [&] { return wait(this, mu, deadline); });
}

void Notification::Notify() {
  static const auto notify = Find<void (*)(Notification*)>("12Notification6NotifyEv");
  Published(this);
  notify(this);
}
void Notification::WaitForNotification() const {
  static const auto wait =
      Find<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  wait(this);
  Received(this);
}
bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto wait = Find<bool (*)(const Notification*, absl::Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  return Received(this, wait(this, timeout));
}
bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto wait = Find<bool (*)(const Notification*, absl::Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  return Received(this, wait(this, deadline));
}

ABSL_NAMESPACE_END
}  // namespace absl
