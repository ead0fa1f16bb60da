// A Backend whose device is the test itself: work enqueued on its streams runs only when
// the test says so, on the test's thread, so that tests of the executor can assert what
// has and has not started at each step, without sleeps and without timing.
//
// Each stream is a queue of waits, event records, kernels and completion callbacks.
// RunReady() takes every stream as far as it can go: a wait passes once its event has
// completed, a record completes its event, a callback runs (with an OK status), and a
// kernel that reaches the head of its stream *starts* and then holds its stream until the
// test calls Finish(name), which runs the kernel's body (its effect on memory) and lets
// the stream go on. A test therefore reads like:
//
//   Submit(stream_a, Write("A", x, 7));
//   Submit(stream_b, Copy("B", x, y));       // reads x: must wait for A
//   backend.RunReady();
//   EXPECT_TRUE(backend.Started("A"));
//   EXPECT_FALSE(backend.Started("B"));      // B has not started: A is not done
//   backend.Finish("A");
//   EXPECT_TRUE(backend.Started("B"));
//
// Nothing runs while work is enqueued (the executor enqueues under its lock, and the
// contract puts callbacks on a backend thread, never inside the enqueueing call). Event
// times come from a clock the test advances, so elapsed times are exact. Memory is host
// memory. Only the kernels a test launches exist: the Backend's own kernels (Fill, Copy,
// Elementwise, ...) are UNIMPLEMENTED. Single-threaded: every call comes from the test's
// thread or from callbacks this backend runs on it.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_SCRIPTED_BACKEND_H_
#define GPUCOMPUTE_TESTS_SUPPORT_SCRIPTED_BACKEND_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/core/backend.h"

namespace gpucompute::testing {

class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend() {
    DeviceDescription device;
    device.index = 0;
    device.name = "scripted";
    device.total_memory_bytes = uint64_t{1} << 40;
    device.compute_units = 1;
    devices_.push_back(device);
  }
  ~ScriptedBackend() override = default;

  // --- The script.

  // Enqueues kernel `name` (unique in this backend) on `stream`. `body` runs when the test
  // finishes the kernel; it should use raw pointers, as device code would, so that it
  // keeps no buffer alive.
  absl::Status Launch(Stream& stream, std::string name,
                      absl::AnyInvocable<void() &&> body = nullptr) {
    if (kernels_.contains(name))
      return absl::InvalidArgumentError(absl::StrCat("kernel ", name, " launched twice"));
    kernels_.emplace(name, KernelState{});
    Entry entry;
    entry.kind = Entry::Kind::kKernel;
    entry.name = std::move(name);
    entry.body = std::move(body);
    return Enqueue(stream, std::move(entry));
  }

  bool Launched(absl::string_view name) const { return kernels_.contains(name); }
  // Whether kernel `name` has reached the head of its stream with every wait before it met.
  bool Started(absl::string_view name) const {
    auto it = kernels_.find(name);
    return it != kernels_.end() && it->second.started;
  }
  bool Finished(absl::string_view name) const {
    auto it = kernels_.find(name);
    return it != kernels_.end() && it->second.finished;
  }
  // The kernels in the order they started.
  const std::vector<std::string>& started_order() const { return started_order_; }

  // Takes every stream as far as it goes without finishing a running kernel.
  void RunReady() {
    std::unique_lock lock(streams_mu_);
    bool progress = true;
    while (progress) {
      progress = false;
      // By index: a callback may create streams.
      for (size_t i = 0; i < streams_.size(); ++i) progress |= Advance(*streams_[i], lock);
    }
  }

  // Finishes running kernel `name` (a test failure if it has not started or has already
  // finished), then RunReady().
  void Finish(absl::string_view name) {
    RunReady();
    auto it = kernels_.find(name);
    if (it == kernels_.end() || !it->second.started || it->second.finished) {
      ADD_FAILURE() << "kernel " << name << " is not running: "
                    << (it == kernels_.end()  ? "never launched"
                        : it->second.finished ? "already finished"
                                              : "not started");
      return;
    }
    it->second.finish = true;
    RunReady();
  }

  // Finishes every kernel as it starts until every stream is empty.
  void RunUntilIdle() {
    for (;;) {
      RunReady();
      bool finished_one = false;
      for (auto& [name, state] : kernels_) {
        if (state.started && !state.finish) {
          state.finish = true;
          finished_one = true;
        }
      }
      if (!finished_one) return;
    }
  }

  // The device clock that event records read.
  void AdvanceClock(double seconds) { now_seconds_ += seconds; }

  // Recording (Stream::BeginCapture): off until a test turns it on. A recording enqueues
  // what it holds when launched, as one unit; a failed one (FailNextCapture) enqueues
  // nothing and forgets its kernels, so that they may be launched again.
  void set_can_capture(bool can) { can_capture_ = can; }
  void FailNextCapture() { fail_next_capture_ = true; }
  int graph_launches() const { return graph_launches_; }

  // --- Backend.

  absl::string_view name() const override { return "scripted"; }
  const std::vector<DeviceDescription>& devices() const override { return devices_; }

  absl::StatusOr<DeviceMemory> Allocate(int device, uint64_t bytes) override {
    void* ptr = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{256});
    return DeviceMemory(ptr, bytes, device,
                        [](void* p, uint64_t) { ::operator delete (p, std::align_val_t{256}); });
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override {
    return std::unique_ptr<Stream>(new ScriptedStream(*this, device));
  }

  // The executor reads it when it is created.
  void set_dispatch_window(int window) { dispatch_window_ = window; }
  int DispatchWindow() const override { return dispatch_window_; }

  absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) override {
    const auto* a = dynamic_cast<const ScriptedEvent*>(&start);
    const auto* b = dynamic_cast<const ScriptedEvent*>(&end);
    if (a == nullptr || b == nullptr)
      return absl::InvalidArgumentError("not this backend's events");
    if (!a->IsComplete() || !b->IsComplete())
      return absl::FailedPreconditionError("event not complete");
    return b->seconds - a->seconds;
  }

  absl::Status CopyFromHost(Stream&, const void*, DeviceMemory&, uint64_t, uint64_t) override {
    return Unscripted("CopyFromHost");
  }
  absl::Status CopyToHost(Stream&, const DeviceMemory&, uint64_t, void*, uint64_t) override {
    return Unscripted("CopyToHost");
  }
  absl::Status Copy(Stream&, const DeviceMemory&, uint64_t, DeviceMemory&, uint64_t,
                    uint64_t) override {
    return Unscripted("Copy");
  }
  absl::Status Fill(Stream&, DeviceMemory&, DType, uint64_t, int64_t) override {
    return Unscripted("Fill");
  }
  absl::StatusOr<LaunchInfo> Elementwise(Stream&, const expr::Program&,
                                         std::span<const DeviceMemory* const>, DeviceMemory&, DType,
                                         int64_t) override {
    return Unscripted("Elementwise");
  }
  absl::Status Reduce(Stream&, ReduceKind, DType, const DeviceMemory&, const ReduceShape&,
                      DeviceMemory&) override {
    return Unscripted("Reduce");
  }
  absl::Status Gemv(Stream&, DType, const GemvShape&, double, const DeviceMemory&,
                    const DeviceMemory&, double, DeviceMemory&) override {
    return Unscripted("Gemv");
  }
  absl::Status Random(Stream&, const RandomParams&, DType, DeviceMemory&, int64_t) override {
    return Unscripted("Random");
  }

 private:
  struct ScriptedEvent final : Event {
    bool IsComplete() const override { return complete; }
    bool complete = false;
    double seconds = 0;  // the clock when it completed
  };

  struct Entry {
    enum class Kind { kWait, kRecord, kKernel, kCallback };
    Kind kind = Kind::kKernel;
    std::shared_ptr<ScriptedEvent> event;                // kWait, kRecord
    std::string name;                                    // kKernel
    absl::AnyInvocable<void() &&> body;                  // kKernel
    absl::AnyInvocable<void(absl::Status) &&> callback;  // kCallback
  };

  struct KernelState {
    bool started = false;
    bool finish = false;  // the test has finished it; it leaves its stream at the next step
    bool finished = false;
  };

  class ScriptedStream final : public Stream {
   public:
    ScriptedStream(ScriptedBackend& backend, int device) : backend_(backend), device_(device) {
      std::lock_guard lock(backend_.streams_mu_);
      backend_.streams_.push_back(this);
    }
    ~ScriptedStream() override {
      std::lock_guard lock(backend_.streams_mu_);
      std::erase(backend_.streams_, this);
    }

    int device() const override { return device_; }
    absl::Status Wait(std::shared_ptr<Event> event) override {
      auto scripted = std::dynamic_pointer_cast<ScriptedEvent>(std::move(event));
      if (scripted == nullptr) return absl::InvalidArgumentError("not this backend's event");
      Entry entry;
      entry.kind = Entry::Kind::kWait;
      entry.event = std::move(scripted);
      Push(std::move(entry));
      return absl::OkStatus();
    }
    absl::StatusOr<std::shared_ptr<Event>> Record() override {
      Entry entry;
      entry.kind = Entry::Kind::kRecord;
      entry.event = std::make_shared<ScriptedEvent>();
      std::shared_ptr<Event> event = entry.event;
      Push(std::move(entry));
      return event;
    }
    absl::Status OnComplete(absl::AnyInvocable<void(absl::Status) &&> fn) override {
      Entry entry;
      entry.kind = Entry::Kind::kCallback;
      entry.callback = std::move(fn);
      Push(std::move(entry));
      return absl::OkStatus();
    }
    bool CanCapture() const override { return backend_.can_capture_; }
    absl::Status BeginCapture() override {
      if (!backend_.can_capture_ || capturing_) return absl::FailedPreconditionError("no capture");
      capturing_ = true;
      return absl::OkStatus();
    }
    absl::Status EndCapture() override {
      if (!capturing_) return absl::FailedPreconditionError("not capturing");
      capturing_ = false;
      ready_ = std::move(recorded_);
      recorded_.clear();
      if (backend_.fail_next_capture_) {
        backend_.fail_next_capture_ = false;
        for (const Entry& e : ready_) {
          if (e.kind == Entry::Kind::kKernel) backend_.kernels_.erase(e.name);
        }
        ready_.clear();
        return absl::InternalError("the recording failed (scripted)");
      }
      return absl::OkStatus();
    }
    absl::Status LaunchCaptured() override {
      for (Entry& e : ready_) queue_.push_back(std::move(e));
      ready_.clear();
      ++backend_.graph_launches_;
      return absl::OkStatus();
    }

   private:
    friend class ScriptedBackend;
    void Push(Entry entry) { (capturing_ ? recorded_ : queue_).push_back(std::move(entry)); }

    ScriptedBackend& backend_;
    const int device_;
    std::deque<Entry> queue_;
    bool capturing_ = false;
    std::deque<Entry> recorded_;  // while capturing_
    std::deque<Entry> ready_;     // recorded, not yet launched
  };

  static absl::Status Unscripted(absl::string_view call) {
    return absl::UnimplementedError(
        absl::StrCat("the scripted backend runs only the kernels a test launches, not ", call));
  }

  absl::Status Enqueue(Stream& stream, Entry entry) {
    auto* scripted = dynamic_cast<ScriptedStream*>(&stream);
    if (scripted == nullptr) return absl::InvalidArgumentError("not this backend's stream");
    scripted->Push(std::move(entry));
    return absl::OkStatus();
  }

  // Runs the head of `stream` while it can; returns whether anything happened. A callback
  // or a kernel body may enqueue on any stream, so each is taken off the queue before it
  // runs, and the caller starts over after it. They run without `lock` (on streams_mu_):
  // they reach the executor, which takes its own lock and then, creating a stream, ours;
  // holding ours across them would take the two in both orders. Meanwhile the executor
  // may destroy `stream`, so it is not used after.
  bool Advance(ScriptedStream& stream, std::unique_lock<std::mutex>& lock) {
    bool progress = false;
    while (!stream.queue_.empty()) {
      Entry& head = stream.queue_.front();
      switch (head.kind) {
        case Entry::Kind::kWait:
          if (!head.event->complete) return progress;
          stream.queue_.pop_front();
          progress = true;
          break;
        case Entry::Kind::kRecord:
          head.event->complete = true;
          head.event->seconds = now_seconds_;
          stream.queue_.pop_front();
          progress = true;
          break;
        case Entry::Kind::kKernel: {
          KernelState& state = kernels_.at(head.name);
          if (!state.started) {
            state.started = true;
            started_order_.push_back(head.name);
            progress = true;
          }
          if (!state.finish) return progress;
          Entry kernel = std::move(head);
          stream.queue_.pop_front();
          lock.unlock();
          if (kernel.body) std::move(kernel.body)();
          kernels_.at(kernel.name).finished = true;
          kernel = Entry();  // what the body held goes without the lock too
          lock.lock();
          return true;
        }
        case Entry::Kind::kCallback: {
          Entry callback = std::move(head);
          stream.queue_.pop_front();
          lock.unlock();
          std::move(callback.callback)(absl::OkStatus());
          callback = Entry();
          lock.lock();
          return true;
        }
      }
    }
    return progress;
  }

  std::vector<DeviceDescription> devices_;
  // The executor destroys retired streams on a thread of its own; everything else runs
  // on the test's thread, within RunReady when it reaches the executor.
  int dispatch_window_ = 64;
  std::mutex streams_mu_;
  std::vector<ScriptedStream*> streams_;  // under streams_mu_
  absl::flat_hash_map<std::string, KernelState> kernels_;
  std::vector<std::string> started_order_;
  double now_seconds_ = 0;
  bool can_capture_ = false;
  bool fail_next_capture_ = false;
  int graph_launches_ = 0;
};

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_SCRIPTED_BACKEND_H_
